/* ``exp_ps``: a vector exp of 16 float32 lanes for the AVX-512 kernels of this folder (the decode
 * kernel's online softmax, the prompt kernel's softmax). Included after the file has checked for
 * AVX-512: it defines nothing otherwise.
 */
#ifndef TRITON_CHAT_VECTOR_EXP_H
#define TRITON_CHAT_VECTOR_EXP_H
#if defined(__AVX512F__)

#include <immintrin.h>

/* exp(x) for float32 lanes, x <= 0 (a score minus its running maximum): Cody-Waite reduction and
 * a degree-6 polynomial (Cephes' expf), within 2 ulp; below -87 it gives about 1e-38, not 0, so
 * masked lanes are zeroed by the caller. */
static inline __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

#endif
#endif
