/* ``exp_ps``: a vector exp of 16 float32 lanes for the AVX-512 kernels of this folder (the decode
 * kernel's online softmax, the prompt kernel's softmax, bfloat16 SiLU); ``exp8_ps``: the same
 * arithmetic on 8 lanes for AVX2 with FMA (float32 SiLU). Each is defined only where its
 * instructions are.
 */
#ifndef TRITON_CHAT_VECTOR_EXP_H
#define TRITON_CHAT_VECTOR_EXP_H

/* Both widths' arithmetic: the clamp, ln 2 split in two for the reduction (Cody-Waite), and the
 * polynomial's coefficients, highest degree first (Cephes' expf). */
#define EXP_LOW -87.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HIGH 0.693359375f
#define EXP_LN2_LOW -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

#if defined(__AVX512F__)

#include <immintrin.h>

/* exp(x) for float32 lanes, x <= 0 (a score minus its running maximum): Cody-Waite reduction and
 * a degree-6 polynomial (Cephes' expf), within 2 ulp; below -87 it gives about 1e-38, not 0, so
 * masked lanes are zeroed by the caller. */
static inline __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(EXP_LOW));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HIGH), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LOW), r);
    __m512 y = _mm512_set1_ps(EXP_P0);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P1));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P2));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P3));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P4));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P5));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

#endif

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* 2^n for integer lanes -126 <= n <= 127 (a normal float's exponent field). */
static inline __m256 pow2_8(__m256i n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
}

/* exp(x) for 8 float32 lanes: exp_ps's reduction and polynomial, with AVX2 in place of AVX-512's
 * roundscale and scalef. x is clamped to [-87, 89]: 2^n is applied as two halves, so above
 * ~88.7 the result overflows to inf as scalef's does, and below -87 it is about 1e-38, not 0. */
static inline __m256 exp8_ps(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LOW)), _mm256_set1_ps(89.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HIGH), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LOW), r);
    __m256 y = _mm256_set1_ps(EXP_P0);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P1));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P2));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P3));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P4));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P5));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i whole = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(whole, 1);
    return _mm256_mul_ps(_mm256_mul_ps(y, pow2_8(half)), pow2_8(_mm256_sub_epi32(whole, half)));
}

#endif
#endif
