/* SiLU for bfloat16 rows on CPUs with AVX-512, alone and times the up projection, in one pass.
 *
 * silu(g) = round(g / (1 + exp(-g))) with g widened to float32 and ``vector_exp.h``'s exp, round()
 * to bfloat16 (nearest even): what PyTorch computes for a bfloat16 SiLU, but for its exp, within 2
 * ulp of float32 before the rounding. ``silu_mul`` then gives round(silu(g) * u), the roundings and
 * order of PyTorch's ``silu(gate) * up`` on bfloat16 tensors, so the model's MLP (whose SiLU is
 * replaced by ``silu``) and the lean decode step (``silu_mul``) agree bit for bit. Each row is done
 * 16 lanes at a time with a masked tail, so an element's result depends on nothing but its value.
 * Built with -ffp-contract=off: the division and the product are each rounded as PyTorch rounds.
 */
#include <stdint.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

#include "silu_math.h"

int triton_chat_silu_available(void) { return 1; }

/* out[r] = silu(x[r]) for ``rows`` rows of ``dim``. Returns 0, or -1 for bad sizes. */
int triton_chat_silu_bf16(const uint16_t *x, int64_t x_stride, uint16_t *out, int64_t out_stride, int64_t rows,
                          int64_t dim) {
    if (rows < 0 || dim <= 0) return -1;
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t *xr = x + r * x_stride;
        uint16_t *o = out + r * out_stride;
        for (int64_t d = 0; d < dim; d += 16) {
            const __mmask16 live = dim - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (dim - d)) - 1);
            _mm256_mask_storeu_epi16(o + d, live, narrow(silu_ps(load_bf16(xr + d, live))));
        }
    }
    return 0;
}

/* out[r] = silu(gate) * up, with gate = gate_up[r][0, dim) and up = gate_up[r][dim, 2 dim). */
int triton_chat_silu_mul_bf16(const uint16_t *gate_up, int64_t gate_up_stride, uint16_t *out, int64_t out_stride,
                              int64_t rows, int64_t dim) {
    if (rows < 0 || dim <= 0) return -1;
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t *g = gate_up + r * gate_up_stride, *u = g + dim;
        uint16_t *o = out + r * out_stride;
        for (int64_t d = 0; d < dim; d += 16) {
            const __mmask16 live = dim - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (dim - d)) - 1);
            const __m512 s = widen_narrowed(silu_ps(load_bf16(g + d, live)));
            _mm256_mask_storeu_epi16(o + d, live, narrow(_mm512_mul_ps(s, load_bf16(u + d, live))));
        }
    }
    return 0;
}

#else

int triton_chat_silu_available(void) { return 0; }

int triton_chat_silu_bf16(const uint16_t *x, int64_t x_stride, uint16_t *out, int64_t out_stride, int64_t rows,
                          int64_t dim) {
    (void)x, (void)x_stride, (void)out, (void)out_stride, (void)rows, (void)dim;
    return -2;
}

int triton_chat_silu_mul_bf16(const uint16_t *gate_up, int64_t gate_up_stride, uint16_t *out, int64_t out_stride,
                              int64_t rows, int64_t dim) {
    (void)gate_up, (void)gate_up_stride, (void)out, (void)out_stride, (void)rows, (void)dim;
    return -2;
}

#endif
