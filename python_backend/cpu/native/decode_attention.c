/* Decode attention (one query row per sequence) over a bfloat16 KV cache, for CPUs.
 *
 * out[b, h, :] = softmax(scale * q[b, h, :] . k[b, h / group, l, :]) @ v[b, h / group, l, :]
 * over the positions l < length where mask[b, l] is non-zero (mask may be NULL: all positions).
 * Masked runs at either end of a row are skipped, not scored: a decode row's left padding, and
 * the causal tail of a prompt's query row (the rows of one prompt share its keys and values,
 * with a batch stride of 0, and each row's mask ends at its own position).
 * Keys and values are read in place from the cache's strided views and widened to float32 row by
 * row; scores, softmax and sums are float32; the output is rounded to bfloat16 (nearest even).
 * Work is split over (sequence, KV head) pairs with OpenMP. With AVX512-BF16 and a head size that
 * is a multiple of 32 (up to 256), each pair takes one pass over its positions, 16 at a time, with
 * the softmax kept online (``attend_online``): keys and values stream through once, interleaved,
 * and no score array is written and read back: a third less time at 64 rows (docs/performance.md).
 * Other sizes take two passes of plain loops (scores, then the weighted sum), where the G query
 * heads that share a KV head read each key and value row once.
 * The float32-query variants below (a float32 model's) read a float32 or a bfloat16 cache.
 */
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define HAVE_DPBF16 1
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

/* Masked positions score this (finite: the file is built with -ffast-math, which assumes no
 * infinities, so that expf vectorizes); exp(MASKED - max) is exactly 0 in float32. */
#define MASKED (-1.0e30f)

/* Scores s[0:length] whose maximum is ``top`` become exp(s - top) in place; returns their sum.
 * Every position masked: every weight 0 and the sum 0, so the output is zeros. */
static inline float softmax_weights(float *s, int64_t length, float top) {
    if (top <= MASKED) {
        for (int64_t l = 0; l < length; ++l) s[l] = 0.0f;
        return 0.0f;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t l = 0; l < length; ++l) {
        const float p = expf(s[l] - top); /* a masked score underflows to exactly 0 */
        s[l] = p;
        sum += p;
    }
    return sum;
}


/* q . k over dim bfloat16 elements, accumulated in float32. */
static inline float dot_bf16(const uint16_t *a, const uint16_t *b, int64_t dim) {
    float sum = 0.0f;
    int64_t d = 0;
#ifdef HAVE_DPBF16
    /* AVX512-BF16: 32 products per instruction, each exact in float32. */
    __m512 acc = _mm512_setzero_ps();
    for (; d + 32 <= dim; d += 32) {
        __m512bh va = (__m512bh)_mm512_loadu_si512((const void *)(a + d));
        __m512bh vb = (__m512bh)_mm512_loadu_si512((const void *)(b + d));
        acc = _mm512_dpbf16_ps(acc, va, vb);
    }
    sum = _mm512_reduce_add_ps(acc);
#endif
    for (; d < dim; ++d) sum += bf16_to_float(a[d]) * bf16_to_float(b[d]);
    return sum;
}

#include "online_attention.h"

/* Returns 0 on success, -1 on bad sizes, -2 when out of memory. */
int triton_chat_decode_attention_bf16(
    const uint16_t *q, int64_t q_stride_b, int64_t q_stride_h,
    const uint16_t *k, int64_t k_stride_b, int64_t k_stride_h, int64_t k_stride_l,
    const uint16_t *v, int64_t v_stride_b, int64_t v_stride_h, int64_t v_stride_l,
    const uint8_t *mask, int64_t mask_stride_b,
    uint16_t *out, int64_t out_stride_b, int64_t out_stride_h,
    int64_t batch, int64_t heads, int64_t kv_heads, int64_t length, int64_t dim, float scale)
{
    if (dim <= 0 || kv_heads <= 0 || heads % kv_heads || length < 0) return -1;
    const int64_t group = heads / kv_heads;
    int status = 0;

#pragma omp parallel
    {
        /* Per thread: each query head's row address [group], scores [group][length],
         * acc [group][dim], a widened value row [dim], each head's maximum and sum [group]. */
        size_t floats = (size_t)(group * (length > 0 ? length : 1) + group * dim + dim + 2 * group);
#ifdef HAVE_DPBF16
        if (online_floats(group, dim) > floats) floats = online_floats(group, dim);
#endif
        /* The query- and output-row addresses come first, where malloc's alignment suits pointers. */
        void *block = malloc(2 * sizeof(void *) * (size_t)group + sizeof(float) * floats);
        const uint16_t **qrows = (const uint16_t **)block;
        uint16_t **orows = block ? (uint16_t **)(qrows + group) : NULL;
        float *scores = block ? (float *)(orows + group) : NULL;
        if (scores == NULL) {
#pragma omp atomic write
            status = -2;
        }
        /* Dynamic: rows differ in length (their padding is skipped), and the running batch keeps
         * them roughly oldest first, so equal halves of the rows are far from equal halves of the work. */
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int64_t b = 0; b < batch; ++b) {
            for (int64_t kh = 0; kh < kv_heads; ++kh) {
                if (scores == NULL) continue;
                float *acc = scores + group * (length > 0 ? length : 1);
                float *row = acc + group * dim;
                float *top = row + dim;
                float *total = top + group;
                const uint8_t *keep = mask ? mask + b * mask_stride_b : NULL;
                for (int64_t g = 0; g < group; ++g) qrows[g] = q + b * q_stride_b + (kh * group + g) * q_stride_h;
                const uint16_t *kbase = k + b * k_stride_b + kh * k_stride_h;
                /* Only [first, stop) is read: a decode row's left padding, a prompt row's causal
                 * tail (prompt_attention.py's rows end where their position does). */
                int64_t first = 0, stop = length;
                while (keep && first < length && !keep[first]) ++first;
                while (keep && stop > first && !keep[stop - 1]) --stop;
#ifdef HAVE_DPBF16
                if (dim % 32 == 0 && dim <= 256) {
                    for (int64_t g = 0; g < group; ++g)
                        orows[g] = out + b * out_stride_b + (kh * group + g) * out_stride_h;
                    attend_online(qrows, group, kbase, k_stride_l, v + b * v_stride_b + kh * v_stride_h, v_stride_l,
                                  keep, first, stop, dim, scale, scores, orows);
                    continue;
                }
#endif
                /* Two passes: the online path above keeps its own sums. */
                for (int64_t g = 0; g < group; ++g) {
                    top[g] = MASKED;
                    total[g] = 0.0f;
                    memset(acc + g * dim, 0, sizeof(float) * (size_t)dim);
                }
                for (int64_t l = 0; l < stop; ++l) {
                    if (keep && !keep[l]) {
                        for (int64_t g = 0; g < group; ++g) scores[g * length + l] = MASKED;
                        continue;
                    }
                    const uint16_t *kr = kbase + l * k_stride_l;
                    for (int64_t g = 0; g < group; ++g) {
                        const float dot = dot_bf16(qrows[g], kr, dim) * scale;
                        scores[g * length + l] = dot;
                        if (dot > top[g]) top[g] = dot;
                    }
                }
                /* Past ``stop`` every position is masked: it would weigh exactly 0. */
                for (int64_t g = 0; g < group; ++g) total[g] = softmax_weights(scores + g * length, stop, top[g]);
                const uint16_t *vbase = v + b * v_stride_b + kh * v_stride_h;
                for (int64_t l = 0; l < stop; ++l) {
                    if (keep && !keep[l]) continue;
                    const uint16_t *vr = vbase + l * v_stride_l;
#pragma omp simd
                    for (int64_t d = 0; d < dim; ++d) row[d] = bf16_to_float(vr[d]);
                    for (int64_t g = 0; g < group; ++g) {
                        const float p = scores[g * length + l];
#pragma omp simd
                        for (int64_t d = 0; d < dim; ++d) acc[g * dim + d] += p * row[d];
                    }
                }
                for (int64_t g = 0; g < group; ++g) {
                    uint16_t *orow = out + b * out_stride_b + (kh * group + g) * out_stride_h;
                    const float inv = total[g] > 0.0f ? 1.0f / total[g] : 0.0f;
                    for (int64_t d = 0; d < dim; ++d) orow[d] = float_to_bf16(acc[g * dim + d] * inv);
                }
            }
        }
        free(block);
    }
    return status;
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2_F32 1
#endif

/* The float32-query kernel reads its cache through these: NARROW is 0 for a float32 cache (a
 * float32 model's) and 1 for a bfloat16 one (``--kv-cache-dtype bfloat16`` under a float32 model:
 * half the bytes per step, each element widened exactly). Every caller passes a constant, so each
 * variant compiles to straight-line loads. */
static inline __attribute__((always_inline)) const void *advance(const void *base, int64_t count, const int narrow) {
    return narrow ? (const void *)((const uint16_t *)base + count) : (const void *)((const float *)base + count);
}

/* Row ``index`` of the cache as float32: in place for a float32 cache, else widened into ``row``.
 * Both dtypes then go through the same loops, so they sum in the same order. */
static inline __attribute__((always_inline)) const float *row_f32(const void *base, int64_t index, int64_t dim,
                                                                  float *row, const int narrow) {
    if (!narrow) return (const float *)base + index;
    const uint16_t *bits = (const uint16_t *)base + index;
    for (int64_t d = 0; d < dim; ++d) row[d] = bf16_to_float(bits[d]);
    return row;
}

#ifdef HAVE_AVX2_F32
static inline __attribute__((always_inline)) __m256 load8(const void *base, int64_t index, const int narrow) {
    if (narrow) {
        const __m128i bits = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + index));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    }
    return _mm256_loadu_ps((const float *)base + index);
}

/* Lane j of the result is the sum of the 8 lanes of v[j]. */
static inline __m256 hsum8x8(const __m256 v[8]) {
    const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
    const __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}

/* The sum of v's 8 lanes, by a fixed tree. */
static inline float hsum8(__m256 v) {
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

/* scale * q . k for the 8 positions from l (dim a multiple of 8): 8 accumulators, one reduction. */
static inline __attribute__((always_inline)) void scores8_f32(const float *qrow, const void *kbase, int64_t k_stride_l,
                                                              int64_t l, int64_t dim, float scale, float *out,
                                                              const int narrow) {
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; d += 8) {
        const __m256 qv = _mm256_loadu_ps(qrow + d);
        for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, load8(kbase, (l + j) * k_stride_l + d, narrow), acc[j]);
    }
    _mm256_storeu_ps(out, _mm256_mul_ps(hsum8x8(acc), _mm256_set1_ps(scale)));
}

/* acc[0:dim] = sum over l of p[l] * v[l, 0:dim], CHUNKS = dim / 8 accumulators in registers. */
static inline __attribute__((always_inline)) void weighted_values_f32_n(const float *p, const void *vbase,
                                                                        int64_t v_stride_l, int64_t first,
                                                                        int64_t length, const int chunks, float *acc,
                                                                        const int narrow) {
    __m256 a[16];
    for (int c = 0; c < chunks; ++c) a[c] = _mm256_setzero_ps();
    for (int64_t l = first; l < length; ++l) {
        const __m256 w = _mm256_set1_ps(p[l]);
        for (int c = 0; c < chunks; ++c) a[c] = _mm256_fmadd_ps(w, load8(vbase, l * v_stride_l + 8 * c, narrow), a[c]);
    }
    for (int c = 0; c < chunks; ++c) _mm256_storeu_ps(acc + 8 * c, a[c]);
}

/* The same with the chunk count a constant in each branch, so that the compiler unrolls the inner
 * loop instead of testing the count at every position. */
static inline __attribute__((always_inline)) void weighted_values_f32(const float *p, const void *vbase,
                                                                      int64_t v_stride_l, int64_t first, int64_t length,
                                                                      const int chunks, float *acc, const int narrow) {
    switch (chunks) {
    case 8: weighted_values_f32_n(p, vbase, v_stride_l, first, length, 8, acc, narrow); break;
    case 16: weighted_values_f32_n(p, vbase, v_stride_l, first, length, 16, acc, narrow); break;
    case 4: weighted_values_f32_n(p, vbase, v_stride_l, first, length, 4, acc, narrow); break;
    default: weighted_values_f32_n(p, vbase, v_stride_l, first, length, chunks, acc, narrow); break;
    }
}
#endif

/* Attention of float32 queries over a float32 (NARROW 0) or bfloat16 (NARROW 1) cache. With AVX2
 * and FMA, and head sizes that are multiples of 8 up to 128, scores are computed 8 positions at a
 * time (one reduction for 8 scores, each block of key rows read from L1 by the G query heads that
 * share it) and each head's weighted sum of values keeps its accumulators in registers; otherwise
 * plain loops that the compiler vectorizes over the head dimension. Two batched matmuls instead
 * read the cache twice and copy the scores between them. */
static inline __attribute__((always_inline)) int decode_attention_f32q(
    const float *q, int64_t q_stride_b, int64_t q_stride_h,
    const void *k, int64_t k_stride_b, int64_t k_stride_h, int64_t k_stride_l,
    const void *v, int64_t v_stride_b, int64_t v_stride_h, int64_t v_stride_l,
    const uint8_t *mask, int64_t mask_stride_b,
    float *out, int64_t out_stride_b, int64_t out_stride_h,
    int64_t batch, int64_t heads, int64_t kv_heads, int64_t length, int64_t dim, float scale, const int narrow)
{
    if (dim <= 0 || kv_heads <= 0 || heads % kv_heads || length < 0) return -1;
    const int64_t group = heads / kv_heads;
    const int64_t span = length > 0 ? length : 1;
    int status = 0;

#pragma omp parallel
    {
        /* Per thread: scores [group][length], acc [group][dim], each head's maximum and sum, a
         * widened cache row [dim]. */
        float *scores = (float *)malloc(sizeof(float) * (size_t)(group * span + group * dim + 2 * group + dim));
        if (scores == NULL) {
#pragma omp atomic write
            status = -2;
        }
        /* Dynamic: rows differ in length (their padding is skipped), and the running batch keeps
         * them roughly oldest first, so equal halves of the rows are far from equal halves of the work. */
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int64_t b = 0; b < batch; ++b) {
            for (int64_t kh = 0; kh < kv_heads; ++kh) {
                if (scores == NULL) continue;
                float *acc = scores + group * span;
                float *top = acc + group * dim;
                float *total = top + group;
                float *wide = total + group;
                const uint8_t *keep = mask ? mask + b * mask_stride_b : NULL;
                const float *qbase = q + b * q_stride_b + kh * group * q_stride_h;
                const void *kbase = advance(k, b * k_stride_b + kh * k_stride_h, narrow);
                const void *vbase = advance(v, b * v_stride_b + kh * v_stride_h, narrow);
                for (int64_t g = 0; g < group; ++g) {
                    top[g] = MASKED;
                    memset(acc + g * dim, 0, sizeof(float) * (size_t)dim);
                }
                /* Only [first, stop) is read, as in the bfloat16 kernel. */
                int64_t first = 0, stop = length;
                while (keep && first < length && !keep[first]) ++first;
                while (keep && stop > first && !keep[stop - 1]) --stop;
#ifdef HAVE_AVX2_F32
                /* Blocks of 8 positions per query head: the block's key rows stay in L1 for the
                 * G heads that read them, and one reduction serves 8 scores. */
                const int vector = dim % 8 == 0 && dim <= 128;
#else
                const int vector = 0;
#endif
#ifdef HAVE_AVX2_F32
                if (vector) {
                    const int64_t blocked = first + (stop - first) / 8 * 8;
                    for (int64_t l = first; l < blocked; l += 8)
                        for (int64_t g = 0; g < group; ++g)
                            scores8_f32(qbase + g * q_stride_h, kbase, k_stride_l, l, dim, scale, scores + g * span + l,
                                        narrow);
                    for (int64_t g = 0; g < group; ++g) {
                        const float *qr = qbase + g * q_stride_h;
                        float *s = scores + g * span;
                        for (int64_t l = 0; l < first; ++l) s[l] = MASKED;
                        for (int64_t l = blocked; l < stop; ++l) {
                            /* Spelled out, so that both cache dtypes sum in the same order. */
                            __m256 dot = _mm256_setzero_ps();
                            for (int64_t d = 0; d < dim; d += 8)
                                dot = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d), load8(kbase, l * k_stride_l + d, narrow), dot);
                            s[l] = hsum8(dot) * scale;
                        }
                        float m = MASKED;
                        for (int64_t l = 0; l < stop; ++l) {
                            if (keep && !keep[l]) s[l] = MASKED;
                            else if (s[l] > m) m = s[l];
                        }
                        top[g] = m;
                    }
                }
#endif
                for (int64_t l = 0; l < stop && !vector; ++l) {
                    if (keep && !keep[l]) {
                        for (int64_t g = 0; g < group; ++g) scores[g * span + l] = MASKED;
                        continue;
                    }
                    const float *kr = row_f32(kbase, l * k_stride_l, dim, wide, narrow);
                    for (int64_t g = 0; g < group; ++g) {
                        const float *qr = qbase + g * q_stride_h;
                        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                        for (int64_t d = 0; d < dim; ++d) dot += qr[d] * kr[d];
                        dot *= scale;
                        scores[g * span + l] = dot;
                        if (dot > top[g]) top[g] = dot;
                    }
                }
                for (int64_t g = 0; g < group; ++g) total[g] = softmax_weights(scores + g * span, stop, top[g]);
#ifdef HAVE_AVX2_F32
                if (vector) {
                    /* Left padding weighs exactly 0 (softmax of MASKED): start after it. */
                    for (int64_t g = 0; g < group; ++g)
                        weighted_values_f32(scores + g * span, vbase, v_stride_l, first, stop, (int)(dim / 8),
                                            acc + g * dim, narrow);
                }
#endif
                for (int64_t l = 0; l < stop && !vector; ++l) {
                    if (keep && !keep[l]) continue;
                    const float *vr = row_f32(vbase, l * v_stride_l, dim, wide, narrow);
                    for (int64_t g = 0; g < group; ++g) {
                        const float p = scores[g * span + l];
                        float *a = acc + g * dim;
#pragma omp simd
                        for (int64_t d = 0; d < dim; ++d) a[d] += p * vr[d];
                    }
                }
                for (int64_t g = 0; g < group; ++g) {
                    float *orow = out + b * out_stride_b + (kh * group + g) * out_stride_h;
                    const float inv = total[g] > 0.0f ? 1.0f / total[g] : 0.0f;
                    for (int64_t d = 0; d < dim; ++d) orow[d] = acc[g * dim + d] * inv;
                }
            }
        }
        free(scores);
    }
    return status;
}

/* Returns 0 on success, -1 on bad sizes, -2 when out of memory. */
int triton_chat_decode_attention_f32(
    const float *q, int64_t q_stride_b, int64_t q_stride_h,
    const float *k, int64_t k_stride_b, int64_t k_stride_h, int64_t k_stride_l,
    const float *v, int64_t v_stride_b, int64_t v_stride_h, int64_t v_stride_l,
    const uint8_t *mask, int64_t mask_stride_b,
    float *out, int64_t out_stride_b, int64_t out_stride_h,
    int64_t batch, int64_t heads, int64_t kv_heads, int64_t length, int64_t dim, float scale)
{
    return decode_attention_f32q(q, q_stride_b, q_stride_h, k, k_stride_b, k_stride_h, k_stride_l, v, v_stride_b,
                                 v_stride_h, v_stride_l, mask, mask_stride_b, out, out_stride_b, out_stride_h, batch,
                                 heads, kv_heads, length, dim, scale, 0);
}

/* Float32 queries and output over a bfloat16 cache; returns as above. */
int triton_chat_decode_attention_f32_bf16kv(
    const float *q, int64_t q_stride_b, int64_t q_stride_h,
    const uint16_t *k, int64_t k_stride_b, int64_t k_stride_h, int64_t k_stride_l,
    const uint16_t *v, int64_t v_stride_b, int64_t v_stride_h, int64_t v_stride_l,
    const uint8_t *mask, int64_t mask_stride_b,
    float *out, int64_t out_stride_b, int64_t out_stride_h,
    int64_t batch, int64_t heads, int64_t kv_heads, int64_t length, int64_t dim, float scale)
{
    return decode_attention_f32q(q, q_stride_b, q_stride_h, k, k_stride_b, k_stride_h, k_stride_l, v, v_stride_b,
                                 v_stride_h, v_stride_l, mask, mask_stride_b, out, out_stride_b, out_stride_h, batch,
                                 heads, kv_heads, length, dim, scale, 1);
}
