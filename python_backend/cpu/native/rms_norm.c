/* RMSNorm of Llama-style decoders, optionally after the residual add, in one pass per row, for CPUs.
 *
 * With a delta:  sum[r] = round(x[r] + delta[r])  (written back to sum), then normed from sum;
 * normed[r] = round(w * round(h * 1 / sqrt(mean(h * h) + eps))), h = the row as float32,
 * where round() rounds float32 to the tensors' dtype (bfloat16, nearest even; float32: none): the
 * same roundings, in the same order, as transformers' LlamaRMSNorm and the add before it. The mean
 * is summed in this file's own order, so results equal PyTorch's within float32 rounding, not
 * bitwise; every caller of a model whose norms are replaced goes through here, so the model's own
 * forward and the lean decode step still agree bit for bit. Rows are independent: a row's result
 * does not depend on how many rows are normed with it. Rows are split over the OpenMP team.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

/* Rows worth a parallel region: below this many elements the team's wake-up costs more. */
#define PARALLEL_ELEMENTS 16384

/* Sixteen partial sums, added by a fixed tree: the same order whatever the row count. */
#define LANES 16

static inline float sum_of_squares(const float *h, int64_t dim) {
    float part[LANES] = {0};
    int64_t d = 0;
    for (; d + LANES <= dim; d += LANES)
        for (int j = 0; j < LANES; ++j) part[j] += h[d + j] * h[d + j];
    for (int j = 0; d < dim; ++d, ++j) part[j] += h[d] * h[d];
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int j = 0; j < width; ++j) part[j] += part[j + width];
    return part[0];
}

/* Widest row normed here: a row's float32 copy lives on the stack of the thread normalizing it. */
#define MAX_DIM 16384

/* Returns 0, or -1 for bad sizes. ``delta`` may be NULL (no add; ``sum`` is then not written). */
int triton_chat_rms_norm_bf16(const uint16_t *x, int64_t x_stride, const uint16_t *delta, int64_t delta_stride,
                              uint16_t *sum, int64_t sum_stride, const uint16_t *weight, uint16_t *out,
                              int64_t out_stride, int64_t rows, int64_t dim, float eps) {
    if (rows < 0 || dim <= 0 || dim > MAX_DIM) return -1;
#pragma omp parallel for schedule(static) if (rows * dim >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; ++r) {
        float h[MAX_DIM];
        const uint16_t *xr = x + r * x_stride;
        if (delta != NULL) {
            const uint16_t *dr = delta + r * delta_stride;
            uint16_t *sr = sum + r * sum_stride;
            for (int64_t d = 0; d < dim; ++d) {
                sr[d] = float_to_bf16(bf16_to_float(xr[d]) + bf16_to_float(dr[d]));
                h[d] = bf16_to_float(sr[d]);
            }
        } else {
            for (int64_t d = 0; d < dim; ++d) h[d] = bf16_to_float(xr[d]);
        }
        const float inv = 1.0f / sqrtf(sum_of_squares(h, dim) / (float)dim + eps);
        uint16_t *o = out + r * out_stride;
        for (int64_t d = 0; d < dim; ++d)
            o[d] = float_to_bf16(bf16_to_float(weight[d]) * bf16_to_float(float_to_bf16(h[d] * inv)));
    }
    return 0;
}

int triton_chat_rms_norm_f32(const float *x, int64_t x_stride, const float *delta, int64_t delta_stride, float *sum,
                             int64_t sum_stride, const float *weight, float *out, int64_t out_stride, int64_t rows,
                             int64_t dim, float eps) {
    if (rows < 0 || dim <= 0 || dim > MAX_DIM) return -1;
#pragma omp parallel for schedule(static) if (rows * dim >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; ++r) {
        const float *h = x + r * x_stride;
        if (delta != NULL) {
            const float *dr = delta + r * delta_stride;
            float *sr = sum + r * sum_stride;
            for (int64_t d = 0; d < dim; ++d) sr[d] = h[d] + dr[d];
            h = sr;
        }
        const float inv = 1.0f / sqrtf(sum_of_squares(h, dim) / (float)dim + eps);
        float *o = out + r * out_stride;
        for (int64_t d = 0; d < dim; ++d) o[d] = weight[d] * (h[d] * inv);
    }
    return 0;
}
