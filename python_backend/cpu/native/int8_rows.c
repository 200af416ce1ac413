/* The two passes around an int8 product (W8A8) on CPU, each one pass over its rows:
 *
 * quantize: levels[r][k] = clamp(round_even(x[r][k] / s[r]), -128, 127), s[r] = max|x[r]| / 127
 *           (dynamic, one scale per row, written to scales) or the one static scale given
 *           (int8_quantize.h, shared with int8_gemm.c);
 * rescale:  out[r][n] = narrow(acc[r][n] * s[r] * w[n] + bias[n]), acc the int32 product, w the
 *           weight's per-channel scales, bias optional, narrow = round to bfloat16 or float16 (float32:
 *           none).
 *
 * In PyTorch each is five to eight operations, each a pass and a dispatch: at decode row counts
 * they cost more than the int8 product itself. Rows are independent, so a row's levels and result
 * do not depend on the other rows of the call. Rows are split over the OpenMP team when a call is
 * large enough to pay for waking it.
 */
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "int8_quantize.h"

#define PARALLEL_ELEMENTS 32768

/* float16 <-> float32 in integer arithmetic (this file is built with -ffast-math, which may not
 * keep the float tricks of faster conversions): widening is exact, narrowing rounds to nearest
 * even as PyTorch does (overflow to infinity, NaN to the quiet NaN). */
static inline float f16_to_float(uint16_t half) {
    const uint32_t sign = (uint32_t)(half & 0x8000u) << 16, exponent = (half >> 10) & 0x1fu, mantissa = half & 0x3ffu;
    uint32_t bits;
    if (exponent == 0x1fu) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else {
        const float tiny = (float)mantissa * 0x1p-24f; /* a subnormal half: exact in float32 */
        memcpy(&bits, &tiny, sizeof bits);
        bits |= sign;
    }
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static inline uint16_t float_to_f16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
    if (magnitude >= 0x477ff000u) return sign | 0x7c00u; /* 65520 and above round to infinity */
    if (magnitude >= 0x38800000u) {                      /* a normal half: rebias, round to even */
        const uint32_t rebiased = magnitude - 0x38000000u;
        return sign | (uint16_t)((rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13);
    }
    if (magnitude <= 0x33000000u) return sign; /* 2**-25 and below round to zero */
    /* A subnormal half: the float's 24-bit significand shifted to units of 2**-24, rounded to even. */
    const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - (magnitude >> 23), half_unit = 1u << (shift - 1);
    const uint32_t kept = significand >> shift, rest = significand & ((1u << shift) - 1u);
    return sign | (uint16_t)(kept + (rest > half_unit || (rest == half_unit && (kept & 1u))));
}

INT8_QUANTIZE_ROW(int8_quantize_row_f16, uint16_t, f16_to_float, int8_load_f16)

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
QUANTIZE(triton_chat_quantize_rows_f16, uint16_t, int8_quantize_row_f16)

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
RESCALE(triton_chat_rescale_rows_f16, uint16_t, float_to_f16)
