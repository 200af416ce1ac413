/* The two passes around an int8 product (W8A8) on CPU, each one pass over its rows:
 *
 * quantize: levels[r][k] = clamp(round_even(x[r][k] / s[r]), -128, 127), s[r] = max|x[r]| / 127
 *           (dynamic, one scale per row, written to scales) or the one static scale given;
 * rescale:  out[r][n] = narrow(acc[r][n] * s[r] * w[n] + bias[n]), acc the int32 product, w the
 *           weight's per-channel scales, bias optional, narrow = round to bfloat16 (float32: none).
 *
 * In PyTorch each is five to eight operations, each a pass and a dispatch: at decode row counts
 * they cost more than the int8 product itself. Rows are independent, so a row's levels and result
 * do not depend on the other rows of the call. Rows are split over the OpenMP team when a call is
 * large enough to pay for waking it.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "bf16.h"

#define PARALLEL_ELEMENTS 32768

static inline int8_t level(float value, float inverse) {
    float q = nearbyintf(value * inverse);
    q = q < -128.0f ? -128.0f : (q > 127.0f ? 127.0f : q);
    return (int8_t)q;
}

/* ``static_scale`` > 0: that scale for every row (scales is then not written); else dynamic. */
#define QUANTIZE(NAME, TYPE, WIDEN)                                                                          \
    int NAME(const TYPE *x, int64_t x_stride, int64_t rows, int64_t dim, float static_scale, int8_t *levels, \
             float *scales) {                                                                                \
        if (rows < 0 || dim <= 0) return -1;                                                                 \
        _Pragma("omp parallel for schedule(static) if (rows * dim >= PARALLEL_ELEMENTS)")                    \
        for (int64_t r = 0; r < rows; ++r) {                                                                 \
            const TYPE *row = x + r * x_stride;                                                              \
            int8_t *out = levels + r * dim;                                                                  \
            float scale = static_scale;                                                                      \
            if (scale <= 0.0f) {                                                                             \
                float top = 0.0f;                                                                            \
                for (int64_t k = 0; k < dim; ++k) top = fmaxf(top, fabsf(WIDEN(row[k])));                    \
                scale = top / 127.0f;                                                                        \
                if (!(scale >= FLT_MIN)) scale = FLT_MIN; /* also NaN rows: their levels are then 0 */       \
                scales[r] = scale;                                                                           \
            }                                                                                                \
            const float inverse = 1.0f / scale;                                                              \
            for (int64_t k = 0; k < dim; ++k) out[k] = level(WIDEN(row[k]), inverse);                        \
        }                                                                                                    \
        return 0;                                                                                            \
    }

static inline float widen_f32(float value) { return value; }
static inline float narrow_f32(float value) { return value; }

QUANTIZE(triton_chat_quantize_rows_bf16, uint16_t, bf16_to_float)
QUANTIZE(triton_chat_quantize_rows_f32, float, widen_f32)

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
