/* One input row of a W8A8 product quantized to int8 levels, for int8_rows.c and int8_gemm.c:
 *
 *   level[k] = clamp(round_even(x[k] / s), -128, 127) + offset,  s = max|x| / 127 (dynamic) or the
 *   static scale given (> 0),
 *
 * stored as bytes: ``offset`` 0 gives the signed levels torch._int_mm takes, 128 the unsigned ones
 * VPDPBUSD multiplies (the shift compensated per channel by the product). Written once so that both
 * products quantize alike; each file still compiles it with its own flags, and on AVX-512 and AVX2
 * it is written with vector intrinsics so that every build vectorises it.
 */
#ifndef TRITON_CHAT_INT8_QUANTIZE_H
#define TRITON_CHAT_INT8_QUANTIZE_H

#include <float.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

/* The level of ``value``: clamped first (a NaN to -128, infinities to the bounds), then rounded to
 * the nearest even integer; the bounds are integers, so this is rounding then clamping. */
static inline uint8_t int8_level(float value, float inverse, int offset) {
    float q = value * inverse;
    q = q > -128.0f ? q : -128.0f;
    q = q < 127.0f ? q : 127.0f;
    return (uint8_t)((int)__builtin_nearbyintf(q) + offset); /* offset 0: the signed level's byte */
}

static inline float int8_widen_f32(float value) { return value; }

/* The scale of a row whose largest magnitude is ``top`` (NaNs skipped): the smallest normal scale
 * stands in for zero rows, so that their levels are 0. */
static inline float int8_row_scale(float top) {
    const float scale = top / 127.0f;
    return scale >= FLT_MIN ? scale : FLT_MIN;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

/* Sixteen values of a row as float32 (masked lanes 0). */
static inline __m512 int8_load_bf16(const uint16_t *row, __mmask16 mask) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, row));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

static inline __m512 int8_load_f32(const float *row, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, row); }

static inline __m512 int8_load_f16(const uint16_t *row, __mmask16 mask) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, row)); /* exact, subnormals too */
}

/* The scalar loop's arithmetic sixteen lanes at a time, so each level is the same: the compiler
 * does not vectorise that loop without -ffast-math (a scalar round per value), and a prompt's rows
 * then took a third as long to quantize as to multiply. MAXPS returns its second operand where
 * either is NaN, which skips NaNs in the maximum and sends them to -128 in the clamp. */
#define INT8_QUANTIZE_ROW(NAME, TYPE, WIDEN, LOAD)                                                        \
    static inline float NAME(const TYPE *row, int64_t dim, float static_scale, int offset, uint8_t *out) { \
        float scale = static_scale;                                                                        \
        if (scale <= 0.0f) {                                                                               \
            __m512 top = _mm512_setzero_ps();                                                              \
            for (int64_t d = 0; d < dim; d += 16) {                                                        \
                const __mmask16 mask = dim - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (dim - d)) - 1u); \
                top = _mm512_max_ps(_mm512_abs_ps(LOAD(row + d, mask)), top);                              \
            }                                                                                              \
            scale = int8_row_scale(_mm512_reduce_max_ps(top));                                             \
        }                                                                                                  \
        const __m512 inverse = _mm512_set1_ps(1.0f / scale);                                               \
        const __m512 low = _mm512_set1_ps(-128.0f), high = _mm512_set1_ps(127.0f);                         \
        const __m512i shift = _mm512_set1_epi32(offset);                                                   \
        for (int64_t d = 0; d < dim; d += 16) {                                                            \
            const __mmask16 mask = dim - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (dim - d)) - 1u); \
            __m512 q = _mm512_mul_ps(LOAD(row + d, mask), inverse);                                        \
            q = _mm512_min_ps(_mm512_max_ps(q, low), high);                                                \
            const __m512i level = _mm512_add_epi32(_mm512_cvt_roundps_epi32(q, _MM_FROUND_TO_NEAREST_INT | \
                                                                                   _MM_FROUND_NO_EXC),     \
                                                   shift);                                                 \
            _mm512_mask_cvtepi32_storeu_epi8(out + d, mask, level);                                        \
        }                                                                                                  \
        return scale;                                                                                      \
    }

#elif defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>

/* Eight values of a row as float32. */
static inline __m256 int8_load_bf16(const uint16_t *row) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)row));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

static inline __m256 int8_load_f32(const float *row) { return _mm256_loadu_ps(row); }

static inline __m256 int8_load_f16(const uint16_t *row) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)row)); /* exact, subnormals too */
}

/* The AVX-512 path's arithmetic eight lanes at a time, the tail in the scalar loop's: the same
 * levels and scale (MAXPS's NaN rule as above; CVTPS2DQ rounds to nearest even). */
#define INT8_QUANTIZE_ROW(NAME, TYPE, WIDEN, LOAD)                                                        \
    static inline float NAME(const TYPE *row, int64_t dim, float static_scale, int offset, uint8_t *out) { \
        const int64_t whole = dim - dim % 8;                                                               \
        float scale = static_scale;                                                                        \
        if (scale <= 0.0f) {                                                                               \
            const __m256 sign = _mm256_set1_ps(-0.0f);                                                     \
            __m256 top8 = _mm256_setzero_ps();                                                             \
            for (int64_t d = 0; d < whole; d += 8) top8 = _mm256_max_ps(_mm256_andnot_ps(sign, LOAD(row + d)), top8); \
            float lanes[8], top = 0.0f;                                                                    \
            _mm256_storeu_ps(lanes, top8);                                                                 \
            for (int j = 0; j < 8; ++j) top = lanes[j] > top ? lanes[j] : top;                             \
            for (int64_t d = whole; d < dim; ++d) {                                                        \
                const float v = WIDEN(row[d]);                                                             \
                const float a = v < 0 ? -v : v;                                                            \
                top = a > top ? a : top;                                                                   \
            }                                                                                              \
            scale = int8_row_scale(top);                                                                   \
        }                                                                                                  \
        const float inverse = 1.0f / scale;                                                                \
        const __m256 inverse8 = _mm256_set1_ps(inverse);                                                   \
        const __m256 low = _mm256_set1_ps(-128.0f), high = _mm256_set1_ps(127.0f);                         \
        const __m256i shift = _mm256_set1_epi32(offset);                                                   \
        for (int64_t d = 0; d < whole; d += 8) {                                                           \
            __m256 q = _mm256_mul_ps(LOAD(row + d), inverse8);                                             \
            q = _mm256_min_ps(_mm256_max_ps(q, low), high);                                                \
            const __m256i level = _mm256_add_epi32(_mm256_cvtps_epi32(q), shift);                          \
            /* The low byte of each lane: the level's byte, signed or shifted. */                          \
            const __m256i bytes = _mm256_shuffle_epi8(level, _mm256_set1_epi32(0x0c080400));               \
            const int32_t first = _mm256_extract_epi32(bytes, 0), second = _mm256_extract_epi32(bytes, 4); \
            memcpy(out + d, &first, 4);                                                                    \
            memcpy(out + d + 4, &second, 4);                                                               \
        }                                                                                                  \
        for (int64_t d = whole; d < dim; ++d) out[d] = int8_level(WIDEN(row[d]), inverse, offset);        \
        return scale;                                                                                      \
    }

#else

/* ``row``'s levels into ``out`` [dim]; returns its scale (``static_scale`` when > 0). WIDEN reads
 * one value as float32; LOAD is the vector path's (unused here). */
#define INT8_QUANTIZE_ROW(NAME, TYPE, WIDEN, LOAD)                                                        \
    static inline float NAME(const TYPE *row, int64_t dim, float static_scale, int offset, uint8_t *out) { \
        float scale = static_scale;                                                                        \
        if (scale <= 0.0f) {                                                                               \
            float top = 0.0f;                                                                              \
            for (int64_t d = 0; d < dim; ++d) {                                                            \
                const float v = WIDEN(row[d]);                                                             \
                const float a = v < 0 ? -v : v;                                                            \
                top = a > top ? a : top; /* a NaN is skipped */                                            \
            }                                                                                              \
            scale = int8_row_scale(top);                                                                   \
        }                                                                                                  \
        const float inverse = 1.0f / scale;                                                                \
        for (int64_t d = 0; d < dim; ++d) out[d] = int8_level(WIDEN(row[d]), inverse, offset);            \
        return scale;                                                                                      \
    }

#endif

/* Each source type's row: WIDEN is one value's float32 (the scalar loop), LOAD sixteen's. */
INT8_QUANTIZE_ROW(int8_quantize_row_bf16, uint16_t, bf16_to_float, int8_load_bf16)
INT8_QUANTIZE_ROW(int8_quantize_row_f32, float, int8_widen_f32, int8_load_f32)

#endif
