/* SiLU's arithmetic for 16 bfloat16 lanes, shared by ``silu.c`` and the gate/up product that
 * ends in it (``bf16_gemm.c``), so that both give the same bits: the bfloat16 widening, the
 * rounding back (nearest even, as PyTorch narrows), and silu(g) = g / (1 + exp(-g)) in float32.
 * Included after the file has checked for AVX-512; the including file is built with
 * -ffp-contract=off, so that each operation rounds as PyTorch's does.
 */
#ifndef TRITON_CHAT_SILU_MATH_H
#define TRITON_CHAT_SILU_MATH_H
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)

#include <immintrin.h>
#include <stdint.h>

#include "vector_exp.h"

/* 16 bfloat16 values widened to float32 (exactly). */
static inline __m512 widen(__m256i half) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

static inline __m512 load_bf16(const uint16_t *p, __mmask16 live) { return widen(_mm256_maskz_loadu_epi16(live, p)); }

/* Nearest even; NaN becomes the quiet NaN 0x7fc0, as PyTorch narrows it. */
static inline __m256i narrow(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), odd), 16);
    rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(rounded);
}

static inline __m512 silu_ps(__m512 g) {
    /* exp_ps takes x <= 0 as its domain's centre but is exact in form above it too: large -g
     * overflows to inf and the quotient to -0, as PyTorch's. */
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

static inline __m512 widen_narrowed(__m512 v) { return widen(narrow(v)); }

/* round(round(silu(g)) * u), for gate and up already bfloat16 values (widened): the roundings and
 * order of PyTorch's ``silu(gate) * up`` on bfloat16 tensors. */
static inline __m256i silu_mul_ps(__m512 g, __m512 u) { return narrow(_mm512_mul_ps(widen_narrowed(silu_ps(g)), u)); }

#endif
#endif
