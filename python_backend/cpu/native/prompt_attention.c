/* Causal attention of one prompt segment's queries over its keys and values, bfloat16, for CPUs
 * with AVX512-BF16.
 *
 * Query row t (t < count) of head h attends to positions l <= past + t of KV head h / group:
 * out[t, h, :] = softmax(scale * q[t, h, :] . k[h / group, l, :]) @ v[h / group, l, :].
 * A prompt's rows share their keys and values, so the work is laid out as two small matrix
 * products per KV head rather than one dot product per (row, position): the keys and values are
 * first repacked into AVX512-BF16's pair layout (two adjacent elements per 32-bit lane), then each
 * work item takes up to VECTORS query vectors (several rows of the G query heads that share a KV
 * head) and computes their scores 16 positions at a time, one key load serving every vector and
 * no horizontal sums; the softmax weights are rounded to bfloat16 and multiplied into the values
 * in the same pair layout, as SDPA's bfloat16 kernels do. Scores, softmax and sums are float32;
 * the softmax runs 16 positions at a time with ``vector_exp.h``'s exp.
 * Work items are handed out longest first (the last rows see the most positions).
 */
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_DPBF16 1
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "vector_exp.h"

/* Query vectors per work item: their score accumulators and the key vector fill the registers. */
#define VECTORS 12
/* Float32 accumulators of the weighted values per pass: up to 24 / (dim / 16) vectors at a time. */
#define VALUE_ACCUMULATORS 24
#define MAX_DIM 256

int triton_chat_prompt_attention_available(void) {
#ifdef HAVE_DPBF16
    return 1;
#else
    return 0;
#endif
}

#ifdef HAVE_DPBF16
/* scores[j][l0 : l0 + 16] = scale * q_j . k[l] for the N vectors (a constant in each caller, so
 * that the accumulators live in registers). ``kp`` is the KV head's keys as [dim / 2][lpad] pairs. */
static inline __attribute__((always_inline)) void score_tile(const uint32_t *const *qp, const uint32_t *kp,
                                                             int64_t lpad, int64_t l0, int64_t pairs, float scale,
                                                             float *scores, int64_t s_stride, const int n) {
    __m512 acc[VECTORS];
    for (int j = 0; j < n; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
        const __m512bh keys = (__m512bh)_mm512_loadu_si512((const void *)(kp + p * lpad + l0));
        for (int j = 0; j < n; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_set1_epi32((int)qp[j][p]), keys);
    }
    const __m512 s = _mm512_set1_ps(scale);
    for (int j = 0; j < n; ++j) _mm512_storeu_ps(scores + j * s_stride + l0, _mm512_mul_ps(acc[j], s));
}

static void score_tiles(const uint32_t *const *qp, const uint32_t *kp, int64_t lpad, int64_t end, int64_t pairs,
                        float scale, float *scores, int64_t s_stride, int n) {
#define TILES(N)                                                                                                \
    case N:                                                                                                     \
        for (int64_t l0 = 0; l0 < end; l0 += 16) score_tile(qp, kp, lpad, l0, pairs, scale, scores, s_stride, N); \
        break;
    switch (n) {
        TILES(1) TILES(2) TILES(3) TILES(4) TILES(5) TILES(6) TILES(7) TILES(8) TILES(9) TILES(10) TILES(11) TILES(12)
    default: break;
    }
#undef TILES
}

/* w[0:end16] = bfloat16(exp(s[l] - max)) over the ``visible`` first scores and 0 past them (end16, a
 * multiple of 16, covers every score written); returns the sum of the unrounded exps. */
static inline float softmax_row(const float *s, uint16_t *w, int64_t visible, int64_t end16) {
    __m512 top = _mm512_set1_ps(-1.0e30f);
    int64_t l = 0;
    for (; l + 16 <= visible; l += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(s + l));
    const __mmask16 tail = (__mmask16)((1u << (visible - l)) - 1u);
    if (tail) top = _mm512_mask_max_ps(top, tail, top, _mm512_maskz_loadu_ps(tail, s + l));
    const __m512 high = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 sum = _mm512_setzero_ps();
    for (l = 0; l < end16; l += 16) {
        const __mmask16 live = l + 16 <= visible ? (__mmask16)0xFFFF
                               : l < visible     ? (__mmask16)((1u << (visible - l)) - 1u)
                                                 : (__mmask16)0;
        const __m512 e = _mm512_maskz_mov_ps(live, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + l), high)));
        sum = _mm512_add_ps(sum, e);
        _mm256_storeu_si256((__m256i *)(w + l), (__m256i)_mm512_cvtneps_pbh(e));
    }
    return _mm512_reduce_add_ps(sum);
}

/* sums[j * dim : (j + 1) * dim] = sum over position pairs m < pairs of weights[j][2m:2m+2] .
 * v[2m:2m+2][0:dim] for n vectors (rows ``w_stride`` apart), ``vp`` the KV head's values as
 * [pairs][dim] pairs, dim = 16 * chunks. ``chunks`` and ``n`` are constants in each caller, so
 * that the n * chunks accumulators live in registers: indexed by run-time counts they went
 * through the stack, and this product took two thirds of the kernel's time. */
static inline __attribute__((always_inline)) void values_tile(const uint32_t *weights, int64_t w_stride,
                                                              const uint32_t *vp, int64_t pairs, float *sums,
                                                              const int chunks, const int n) {
    __m512 acc[VALUE_ACCUMULATORS];
    for (int i = 0; i < n * chunks; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t m = 0; m < pairs; ++m) {
        const uint32_t *row = vp + m * 16 * chunks;
        for (int j = 0; j < n; ++j) {
            const __m512bh w = (__m512bh)_mm512_set1_epi32((int)weights[j * w_stride + m]);
            for (int c = 0; c < chunks; ++c)
                acc[j * chunks + c] =
                    _mm512_dpbf16_ps(acc[j * chunks + c], w, (__m512bh)_mm512_loadu_si512((const void *)(row + 16 * c)));
        }
    }
    for (int i = 0; i < n * chunks; ++i) _mm512_storeu_ps(sums + 16 * i, acc[i]);
}

/* values_tile for any chunks and n (n * chunks <= VALUE_ACCUMULATORS): specialised for head sizes
 * 32, 64 and 128; other sizes take the same function with run-time counts. */
static void values_sums(const uint32_t *weights, int64_t w_stride, const uint32_t *vp, int64_t pairs, int64_t chunks,
                        int n, float *sums) {
#define VALUES(C, N)                                                \
    case (C) * 32 + (N):                                            \
        values_tile(weights, w_stride, vp, pairs, sums, (C), (N)); \
        return;
    switch (chunks * 32 + n) {
        VALUES(2, 1) VALUES(2, 2) VALUES(2, 3) VALUES(2, 4) VALUES(2, 5) VALUES(2, 6)
        VALUES(2, 7) VALUES(2, 8) VALUES(2, 9) VALUES(2, 10) VALUES(2, 11) VALUES(2, 12)
        VALUES(4, 1) VALUES(4, 2) VALUES(4, 3) VALUES(4, 4) VALUES(4, 5) VALUES(4, 6)
        VALUES(8, 1) VALUES(8, 2) VALUES(8, 3)
    default: break;
    }
#undef VALUES
    values_tile(weights, w_stride, vp, pairs, sums, (int)chunks, n); /* run-time counts: the stack */
}

/* out[j][0:dim] = the weighted values of ``count`` vectors (``values_sums``), each divided by its
 * total and rounded into ``outs[j]``. */
static void weighted_values(const uint32_t *weights, int64_t w_stride, const uint32_t *vp, int64_t pairs, int64_t dim,
                            int count, const float *totals, uint16_t *const *outs) {
    const int64_t chunks = dim / 16;
    const int per = chunks < VALUE_ACCUMULATORS ? (int)(VALUE_ACCUMULATORS / chunks) : 1;
    float sums[VALUE_ACCUMULATORS * 16];
    for (int j0 = 0; j0 < count; j0 += per) {
        const int n = count - j0 < per ? count - j0 : per;
        values_sums(weights + j0 * w_stride, w_stride, vp, pairs, chunks, n, sums);
        for (int j = 0; j < n; ++j) {
            const float inv = totals[j0 + j] > 0.0f ? 1.0f / totals[j0 + j] : 0.0f;
            uint16_t *o = outs[j0 + j];
            for (int64_t d = 0; d < dim; ++d) o[d] = float_to_bf16(sums[j * dim + d] * inv);
        }
    }
}
#endif

/* Returns 0 on success, -1 on bad sizes, -2 when out of memory, -3 without AVX512-BF16. */
int triton_chat_prompt_attention_bf16(
    const uint16_t *q, int64_t q_stride_t, int64_t q_stride_h,
    const uint16_t *k, int64_t k_stride_h, int64_t k_stride_l,
    const uint16_t *v, int64_t v_stride_h, int64_t v_stride_l,
    uint16_t *out, int64_t out_stride_t, int64_t out_stride_h,
    int64_t count, int64_t past, int64_t heads, int64_t kv_heads, int64_t dim, float scale)
{
#ifndef HAVE_DPBF16
    (void)q, (void)q_stride_t, (void)q_stride_h, (void)k, (void)k_stride_h, (void)k_stride_l, (void)v;
    (void)v_stride_h, (void)v_stride_l, (void)out, (void)out_stride_t, (void)out_stride_h, (void)count, (void)past;
    (void)heads, (void)kv_heads, (void)dim, (void)scale;
    return -3;
#else
    if (count <= 0 || past < 0 || kv_heads <= 0 || heads % kv_heads || dim <= 0 || dim % 32 || dim > MAX_DIM)
        return -1;
    if ((q_stride_t | q_stride_h | k_stride_h | k_stride_l | v_stride_h | v_stride_l) & 1) return -1; /* pairs */
    const int64_t group = heads / kv_heads, length = past + count;
    const int64_t lpad = (length + 15) / 16 * 16, pairs = dim / 2;
    /* Per KV head: keys as [dim / 2][lpad] pairs, values as [lpad / 2][dim] pairs; zeros past the end. */
    uint32_t *kp = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)(kv_heads * pairs * lpad));
    uint32_t *vp = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)(kv_heads * (lpad / 2) * dim));
    if (kp == NULL || vp == NULL) {
        free(kp);
        free(vp);
        return -2;
    }
    const int64_t rows_per = group < VECTORS ? VECTORS / group : 1;
    const int64_t head_span = group < VECTORS ? group : VECTORS;
    const int64_t subgroups = (group + head_span - 1) / head_span;
    const int64_t blocks = (count + rows_per - 1) / rows_per;
    const int64_t lanes = kv_heads * subgroups;
    int status = 0;

#pragma omp parallel
    {
#pragma omp for collapse(2) schedule(static)
        for (int64_t kh = 0; kh < kv_heads; ++kh) {
            for (int64_t m = 0; m < lpad / 2; ++m) { /* positions 2m and 2m + 1 */
                uint32_t *vrow = vp + (kh * (lpad / 2) + m) * dim;
                for (int64_t d = 0; d < dim; ++d) vrow[d] = 0;
                for (int64_t l = 2 * m; l < 2 * m + 2; ++l) {
                    uint32_t *kcol = kp + kh * pairs * lpad + l;
                    if (l >= length) {
                        for (int64_t p = 0; p < pairs; ++p) kcol[p * lpad] = 0;
                        continue;
                    }
                    const uint32_t *krow = (const uint32_t *)(k + kh * k_stride_h + l * k_stride_l);
                    for (int64_t p = 0; p < pairs; ++p) kcol[p * lpad] = krow[p];
                    const uint16_t *vsrc = v + kh * v_stride_h + l * v_stride_l;
                    const int shift = (int)(l & 1) * 16; /* the pair's first position in the low half */
                    for (int64_t d = 0; d < dim; ++d) vrow[d] |= (uint32_t)vsrc[d] << shift;
                }
            }
        }
        /* Per thread: scores [VECTORS][lpad] float32, weights [VECTORS][lpad] bfloat16 (as pairs). */
        float *scores = (float *)malloc(sizeof(float) * (size_t)(VECTORS * lpad) + sizeof(uint16_t) * (size_t)(VECTORS * lpad));
        uint16_t *weights = scores ? (uint16_t *)(scores + VECTORS * lpad) : NULL;
        if (scores == NULL) {
#pragma omp atomic write
            status = -2;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < blocks * lanes; ++item) {
            if (scores == NULL) continue;
            const int64_t block = blocks - 1 - item / lanes; /* the longest rows first */
            const int64_t kh = (item % lanes) / subgroups, h0 = (item % subgroups) * head_span;
            const int64_t t0 = block * rows_per;
            const int64_t rows = count - t0 < rows_per ? count - t0 : rows_per;
            const int64_t span = group - h0 < head_span ? group - h0 : head_span;
            const int n = (int)(rows * span);
            const uint32_t *qp[VECTORS];
            uint16_t *outs[VECTORS];
            int64_t visible[VECTORS];
            float totals[VECTORS];
            for (int64_t r = 0; r < rows; ++r) {
                for (int64_t hh = 0; hh < span; ++hh) {
                    const int64_t j = r * span + hh, head = kh * group + h0 + hh;
                    qp[j] = (const uint32_t *)(q + (t0 + r) * q_stride_t + head * q_stride_h);
                    outs[j] = out + (t0 + r) * out_stride_t + head * out_stride_h;
                    visible[j] = past + t0 + r + 1;
                }
            }
            const int64_t end = past + t0 + rows; /* the last row's positions; every tile ends by lpad */
            const int64_t end16 = (end + 15) / 16 * 16;
            score_tiles(qp, kp + kh * pairs * lpad, lpad, end, pairs, scale, scores, lpad, n);
            for (int j = 0; j < n; ++j)
                totals[j] = softmax_row(scores + j * lpad, weights + j * lpad, visible[j], end16);
            weighted_values((const uint32_t *)weights, lpad / 2, vp + kh * (lpad / 2) * dim, end16 / 2, dim, n, totals,
                            outs);
        }
        free(scores);
    }
    free(kp);
    free(vp);
    return status;
#endif
}
