/* Rotary position embedding of the query and key heads of a step's tokens, in one pass, for CPUs.
 *
 * out[t, h, d] = round(round(x[t, h, d] * cos[t, d]) + round(r[t, h, d] * sin[t, d])), where
 * r = rotate_half(x) (-x[d + D/2] for d < D/2, x[d - D/2] above) and round() rounds float32 to the
 * tensors' dtype (bfloat16, nearest even; float32: none): exactly the operations, roundings and
 * order of transformers' ``(x * cos) + (rotate_half(x) * sin)``, each of which PyTorch computes in
 * float32 and rounds, so the result is bit-identical. Built with -ffp-contract=off: a fused
 * multiply-add would round once where PyTorch rounds twice. Tokens are split over the OpenMP team.
 */
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define PARALLEL_ELEMENTS 16384
#define MAX_DIM 1024

/* x: token t's head h at x + t * x_stride + h * dim (heads adjacent, each contiguous); cos, sin:
 * [tokens, dim] contiguous; out: [tokens, heads, dim] contiguous. Returns 0, or -1 for bad sizes. */
int triton_chat_rope_bf16(const uint16_t *x, int64_t x_stride, const uint16_t *cos, const uint16_t *sin,
                          uint16_t *out, int64_t tokens, int64_t heads, int64_t dim) {
    if (tokens < 0 || heads <= 0 || dim <= 0 || dim % 2 || dim > MAX_DIM) return -1;
    const int64_t half = dim / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * dim >= PARALLEL_ELEMENTS)
    for (int64_t t = 0; t < tokens; ++t) {
        const uint16_t *c = cos + t * dim, *s = sin + t * dim;
        for (int64_t h = 0; h < heads; ++h) {
            const uint16_t *xr = x + t * x_stride + h * dim;
            uint16_t *o = out + (t * heads + h) * dim;
            for (int64_t d = 0; d < dim; ++d) {
                const float rotated = d < half ? -bf16_to_float(xr[d + half]) : bf16_to_float(xr[d - half]);
                const float sum = round_bf16(bf16_to_float(xr[d]) * bf16_to_float(c[d])) +
                                  round_bf16(rotated * bf16_to_float(s[d]));
                o[d] = float_to_bf16(sum);
            }
        }
    }
    return 0;
}

int triton_chat_rope_f32(const float *x, int64_t x_stride, const float *cos, const float *sin, float *out,
                         int64_t tokens, int64_t heads, int64_t dim) {
    if (tokens < 0 || heads <= 0 || dim <= 0 || dim % 2 || dim > MAX_DIM) return -1;
    const int64_t half = dim / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * dim >= PARALLEL_ELEMENTS)
    for (int64_t t = 0; t < tokens; ++t) {
        const float *c = cos + t * dim, *s = sin + t * dim;
        for (int64_t h = 0; h < heads; ++h) {
            const float *xr = x + t * x_stride + h * dim;
            float *o = out + (t * heads + h) * dim;
            for (int64_t d = 0; d < dim; ++d) {
                const float rotated = d < half ? -xr[d + half] : xr[d - half];
                const float first = xr[d] * c[d], second = rotated * s[d];
                o[d] = first + second;
            }
        }
    }
    return 0;
}
