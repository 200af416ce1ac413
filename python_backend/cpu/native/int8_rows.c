/* The two passes around an int8 product (W8A8) on CPU, each one pass over its rows:
 *
 * quantize: levels[r][k] = clamp(round_even(x[r][k] / s[r]), -128, 127), s[r] = max|x[r]| / 127
 *           (dynamic, one scale per row, written to scales) or the one static scale given
 *           (int8_quantize.h, shared with int8_gemm.c);
 * rescale:  out[r][n] = narrow(acc[r][n] * s[r] * w[n] + bias[n]), acc the int32 product, w the
 *           weight's per-channel scales, bias optional, narrow = round to bfloat16 (float32: none).
 *
 * In PyTorch each is five to eight operations, each a pass and a dispatch: at decode row counts
 * they cost more than the int8 product itself. Rows are independent, so a row's levels and result
 * do not depend on the other rows of the call. Rows are split over the OpenMP team when a call is
 * large enough to pay for waking it.
 */
#include <stdint.h>

#include "bf16.h"
#include "int8_quantize.h"

#define PARALLEL_ELEMENTS 32768

/* ``static_scale`` > 0: that scale for every row (scales is then not written); else dynamic. */
#define QUANTIZE(NAME, TYPE, ROW)                                                                            \
    int NAME(const TYPE *x, int64_t x_stride, int64_t rows, int64_t dim, float static_scale, int8_t *levels, \
             float *scales) {                                                                                \
        if (rows < 0 || dim <= 0) return -1;                                                                 \
        _Pragma("omp parallel for schedule(static) if (rows * dim >= PARALLEL_ELEMENTS)")                    \
        for (int64_t r = 0; r < rows; ++r) {                                                                 \
            const float scale = ROW(x + r * x_stride, dim, static_scale, 0, (uint8_t *)levels + r * dim);    \
            if (static_scale <= 0.0f) scales[r] = scale;                                                     \
        }                                                                                                    \
        return 0;                                                                                            \
    }

QUANTIZE(triton_chat_quantize_rows_bf16, uint16_t, int8_quantize_row_bf16)
QUANTIZE(triton_chat_quantize_rows_f32, float, int8_quantize_row_f32)

static inline float narrow_f32(float value) { return value; }

/* ``row_scales`` holds ``rows`` scales, or one (a static scale) when ``row_step`` is 0. */
#define RESCALE(NAME, TYPE, NARROW)                                                                          \
    int NAME(const int32_t *acc, int64_t rows, int64_t cols, const float *row_scales, int64_t row_step,     \
             const float *col_scales, const float *bias, TYPE *out) {                                        \
        if (rows < 0 || cols <= 0) return -1;                                                                \
        _Pragma("omp parallel for schedule(static) if (rows * cols >= PARALLEL_ELEMENTS)")                   \
        for (int64_t r = 0; r < rows; ++r) {                                                                 \
            const int32_t *in = acc + r * cols;                                                              \
            TYPE *o = out + r * cols;                                                                        \
            const float s = row_scales[r * row_step];                                                        \
            if (bias != NULL) {                                                                              \
                for (int64_t n = 0; n < cols; ++n) o[n] = NARROW((float)in[n] * s * col_scales[n] + bias[n]); \
            } else {                                                                                         \
                for (int64_t n = 0; n < cols; ++n) o[n] = NARROW((float)in[n] * s * col_scales[n]);        \
            }                                                                                                \
        }                                                                                                    \
        return 0;                                                                                            \
    }

RESCALE(triton_chat_rescale_rows_bf16, uint16_t, float_to_bf16)
RESCALE(triton_chat_rescale_rows_f32, float, narrow_f32)
