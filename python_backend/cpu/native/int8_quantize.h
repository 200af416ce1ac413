/* One input row of a W8A8 product quantized to int8 levels, for int8_rows.c and int8_gemm.c:
 *
 *   level[k] = clamp(round_even(x[k] / s), -128, 127) + offset,  s = max|x| / 127 (dynamic) or the
 *   static scale given (> 0),
 *
 * stored as bytes: ``offset`` 0 gives the signed levels torch._int_mm takes, 128 the unsigned ones
 * VPDPBUSD multiplies (the shift compensated per channel by the product). Written once so that both
 * products quantize alike; each file still compiles it with its own flags.
 */
#ifndef TRITON_CHAT_INT8_QUANTIZE_H
#define TRITON_CHAT_INT8_QUANTIZE_H

#include <float.h>
#include <stdint.h>

#include "bf16.h"

static inline uint8_t int8_level(float value, float inverse, int offset) {
    float q = __builtin_nearbyintf(value * inverse);
    q = q < -128.0f ? -128.0f : (q > 127.0f ? 127.0f : q);
    return (uint8_t)((int)q + offset); /* offset 0: the signed level's byte (two's complement) */
}

static inline float int8_widen_f32(float value) { return value; }

/* ``row``'s levels into ``out`` [dim]; returns its scale (``static_scale`` when > 0). The smallest
 * normal scale stands in for zero rows, so that their levels are 0. */
#define INT8_QUANTIZE_ROW(NAME, TYPE, WIDEN)                                                              \
    static inline float NAME(const TYPE *row, int64_t dim, float static_scale, int offset, uint8_t *out) { \
        float scale = static_scale;                                                                        \
        if (scale <= 0.0f) {                                                                               \
            float top = 0.0f;                                                                              \
            for (int64_t d = 0; d < dim; ++d) {                                                            \
                const float v = WIDEN(row[d]);                                                             \
                const float a = v < 0 ? -v : v;                                                            \
                top = top > a ? top : a;                                                                   \
            }                                                                                              \
            scale = top / 127.0f;                                                                          \
            if (!(scale >= FLT_MIN)) scale = FLT_MIN; /* zero and NaN rows */                              \
        }                                                                                                  \
        const float inverse = 1.0f / scale;                                                                \
        for (int64_t d = 0; d < dim; ++d) out[d] = int8_level(WIDEN(row[d]), inverse, offset);            \
        return scale;                                                                                      \
    }

INT8_QUANTIZE_ROW(int8_quantize_row_bf16, uint16_t, bf16_to_float)
INT8_QUANTIZE_ROW(int8_quantize_row_f32, float, int8_widen_f32)

#endif
