/* SiLU for bfloat16 rows on CPUs with AVX-512 and float32 rows on CPUs with AVX2 and FMA, alone
 * and times the up projection, in one pass.
 *
 * silu(g) = round(g / (1 + exp(-g))) with g widened to float32 and ``vector_exp.h``'s exp, round()
 * to bfloat16 (nearest even): what PyTorch computes for a bfloat16 SiLU, but for its exp, within 2
 * ulp of float32 before the rounding. ``silu_mul`` then gives round(silu(g) * u), the roundings and
 * order of PyTorch's ``silu(gate) * up`` on bfloat16 tensors, so the model's MLP (whose SiLU is
 * replaced by ``silu``) and the lean decode step (``silu_mul``) agree bit for bit. Each row is done
 * 16 lanes at a time with a masked tail, so an element's result depends on nothing but its value.
 * Built with -ffp-contract=off: the division and the product are each rounded as PyTorch rounds.
 *
 * Float32 rows take the same arithmetic 8 lanes at a time (``vector_exp.h``'s ``exp8_ps``), with
 * no rounding but float32's: silu(g) = g / (1 + exp(-g)), and silu_mul = silu(g) * u.
 * ``triton_chat_silu_dtypes`` says which builds this CPU has (1: bfloat16, 2: float32).
 */
#include <stdint.h>

#define SILU_BF16 1
#define SILU_F32 2

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

#include "silu_math.h"

#define HAVE_BF16 SILU_BF16

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
            _mm256_mask_storeu_epi16(o + d, live, silu_mul_ps(load_bf16(g + d, live), load_bf16(u + d, live)));
        }
    }
    return 0;
}

#else

#define HAVE_BF16 0

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

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "vector_exp.h"

#define HAVE_F32 SILU_F32

static inline __m256 silu8_ps(__m256 g) {
    const __m256 e = exp8_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* Lanes [0, count) of 8 live: the tail of a row, read and written without touching what follows. */
static inline __m256i live8(int64_t count) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(count < 8 ? count : 8)), lanes);
}

int triton_chat_silu_f32(const float *x, int64_t x_stride, float *out, int64_t out_stride, int64_t rows, int64_t dim) {
    if (rows < 0 || dim <= 0) return -1;
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * x_stride;
        float *o = out + r * out_stride;
        for (int64_t d = 0; d < dim; d += 8) {
            const __m256i live = live8(dim - d);
            _mm256_maskstore_ps(o + d, live, silu8_ps(_mm256_maskload_ps(xr + d, live)));
        }
    }
    return 0;
}

int triton_chat_silu_mul_f32(const float *gate_up, int64_t gate_up_stride, float *out, int64_t out_stride, int64_t rows,
                             int64_t dim) {
    if (rows < 0 || dim <= 0) return -1;
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const float *g = gate_up + r * gate_up_stride, *u = g + dim;
        float *o = out + r * out_stride;
        for (int64_t d = 0; d < dim; d += 8) {
            const __m256i live = live8(dim - d);
            const __m256 s = silu8_ps(_mm256_maskload_ps(g + d, live));
            _mm256_maskstore_ps(o + d, live, _mm256_mul_ps(s, _mm256_maskload_ps(u + d, live)));
        }
    }
    return 0;
}

#else

#define HAVE_F32 0

int triton_chat_silu_f32(const float *x, int64_t x_stride, float *out, int64_t out_stride, int64_t rows, int64_t dim) {
    (void)x, (void)x_stride, (void)out, (void)out_stride, (void)rows, (void)dim;
    return -2;
}

int triton_chat_silu_mul_f32(const float *gate_up, int64_t gate_up_stride, float *out, int64_t out_stride, int64_t rows,
                             int64_t dim) {
    (void)gate_up, (void)gate_up_stride, (void)out, (void)out_stride, (void)rows, (void)dim;
    return -2;
}

#endif

int triton_chat_silu_dtypes(void) { return HAVE_BF16 | HAVE_F32; }
