/* The one-pass decode attention of ``decode_attention.c`` for AVX512-BF16 CPUs: ``attend_online``
 * takes one (sequence, KV head) pair over its positions 16 at a time, keeping the softmax online, and
 * the helpers it is built from (scores of a block, the weighted sum of a block's value rows; the
 * vector exp is ``vector_exp.h``'s). Included by ``decode_attention.c`` only, after it defines
 * HAVE_DPBF16 and MASKED.
 */
#ifndef TRITON_CHAT_ONLINE_ATTENTION_H
#define TRITON_CHAT_ONLINE_ATTENTION_H
#ifdef HAVE_DPBF16

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "vector_exp.h"

/* Lane j of the result is the sum of the 16 lanes of v[j], by one fixed tree (pairs within each
 * 128-bit lane, then lanes): 16 sums for about 3 instructions each instead of ~8 for one
 * _mm512_reduce_add_ps. Every score goes through this same tree, whichever block it falls in. */
static inline __m512 hsum16(const __m512 v[16]) {
    __m512 t[8], u[4], y[2];
    for (int i = 0; i < 8; ++i)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {
        const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int i = 0; i < 2; ++i)
        y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88), _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
}

/* A cache row (its ``dim`` bfloat16 values) this many rows ahead is asked for early: the
 * loops below read rows in order, and from DRAM the hardware prefetcher alone left each core
 * waiting (1.93 against 1.72 ms a layer at 64 rows of 545 positions on an AMX Xeon). The rows are
 * asked into L2, not L1: requests into L1 share the few L1 fill buffers with the loads themselves,
 * and stalled the loop once they were full (64 rows of 200-492 positions on Zen 4: 0.92-1.05
 * against 0.73-0.82 ms a layer). A prefetch past the window's end is harmless: it never faults. */
#define PREFETCH_ROWS 16
static inline void prefetch_row(const uint16_t *row, int64_t dim) {
    for (int64_t byte = 0; byte < 2 * dim; byte += 64) _mm_prefetch((const char *)row + byte, _MM_HINT_T1);
}

/* scale * q . k for positions [l, l + count) (count <= 16; lanes past it are 0), dim a multiple
 * of 32. The next block's key and value rows are asked for early. Each position's products are
 * summed over the head dimension in order, as one chain per position; the positions' chains run
 * side by side (the loop over positions inside the one over dimensions, unrolled), so that the
 * bfloat16 dot products' latency is hidden: one chain at a time left the core waiting on each. */
static inline __m512 scores_block(const uint16_t *qrow, const uint16_t *kbase, int64_t k_stride_l,
                                  const uint16_t *vbase, int64_t v_stride_l, int64_t l, int64_t count, int64_t dim,
                                  float scale, int fetch) {
    __m512 acc[16];
    const uint16_t *krows = kbase + l * k_stride_l;
    if (fetch)
        for (int64_t j = 0; j < count; ++j) {
            prefetch_row(krows + (j + PREFETCH_ROWS) * k_stride_l, dim);
            prefetch_row(vbase + (l + j + PREFETCH_ROWS) * v_stride_l, dim);
        }
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dim; d += 32) {
        const __m512bh q = (__m512bh)_mm512_loadu_si512((const void *)(qrow + d));
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j)
            if (j < count)
                acc[j] = _mm512_dpbf16_ps(acc[j], q,
                                          (__m512bh)_mm512_loadu_si512((const void *)(krows + j * k_stride_l + d)));
    }
    return _mm512_mul_ps(hsum16(acc), _mm512_set1_ps(scale));
}

/* acc[g][:] += sum over the live positions j of the block of p[g][j] * v[l + j, :], for PER query
 * heads at a time whose PER * CHUNKS accumulators stay in registers (CHUNKS = dim / 16). A value
 * row is widened by interleaving it with zeros: each 128-bit lane of 8 bfloat16 gives its first 4
 * as float32 in ``lo`` and its last 4 in ``hi``, so acc holds each 32-wide slice in that order
 * (``slot_dim`` maps it back). The sum runs over positions in order, whatever the head grouping. */
static inline __attribute__((always_inline)) void values_block(const float *p, const uint16_t *vrows,
                                                               int64_t v_stride_l, uint32_t live, int64_t group,
                                                               const int chunks, const int per, float *acc,
                                                               int64_t dim) {
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t g0 = 0; g0 < group; g0 += per) {
        const int64_t heads = group - g0 < per ? group - g0 : per;
        __m512 a[24];
        for (int h = 0; h < per; ++h)
            for (int c = 0; c < chunks; ++c)
                a[h * chunks + c] = h < heads ? _mm512_loadu_ps(acc + (g0 + h) * dim + 16 * c) : _mm512_setzero_ps();
        for (uint32_t rest = live; rest; rest &= rest - 1) {
            const int j = __builtin_ctz(rest);
            const uint16_t *vr = vrows + j * v_stride_l;
            __m512 row[16];
            for (int c = 0; c < chunks; c += 2) {
                const __m512i bits = _mm512_loadu_si512((const void *)(vr + 16 * c));
                row[c] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, bits));
                row[c + 1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, bits));
            }
            for (int h = 0; h < per; ++h) {
                if (h >= heads) break;
                const __m512 w = _mm512_set1_ps(p[(g0 + h) * 16 + j]);
                for (int c = 0; c < chunks; ++c) a[h * chunks + c] = _mm512_fmadd_ps(w, row[c], a[h * chunks + c]);
            }
        }
        for (int h = 0; h < per; ++h)
            for (int c = 0; c < chunks; ++c)
                if (h < heads) _mm512_storeu_ps(acc + (g0 + h) * dim + 16 * c, a[h * chunks + c]);
    }
}

/* The dimension that slot i of ``values_block``'s accumulators holds. */
static inline int64_t slot_dim(int64_t i) {
    const int64_t j = i % 32;
    return i - j + 8 * ((j % 16) / 4) + (j >= 16 ? 4 : 0) + j % 4;
}

/* Scratch floats ``attend_online`` needs for ``group`` query heads of ``dim``. */
static inline size_t online_floats(int64_t group, int64_t dim) { return (size_t)(group * (dim + 16 + 16 + 1)); }

/* One (sequence, KV head) pair in one pass over [first, stop), 16 positions at a time, with the
 * softmax kept online (a running maximum per head; the sums so far are rescaled when it rises), so
 * each key and value row is read once and no score array is written back and read again. Blocks
 * start at ``first``, so padding before it never changes a row's result. Head sizes that are a
 * multiple of 32, up to 256. */
static void attend_online(const uint16_t *const *qrows, int64_t group, const uint16_t *kbase, int64_t k_stride_l,
                          const uint16_t *vbase, int64_t v_stride_l, const uint8_t *keep, int64_t first,
                          int64_t stop, int64_t dim, float scale, float *scratch, uint16_t *const *orows) {
    float *acc = scratch, *p = acc + group * dim, *sums = p + group * 16, *top = sums + group * 16;
    memset(acc, 0, sizeof(float) * (size_t)(group * dim));
    memset(sums, 0, sizeof(float) * (size_t)(group * 16));
    for (int64_t g = 0; g < group; ++g) top[g] = MASKED;
    const int chunks = (int)(dim / 16);
    for (int64_t l = first; l < stop; l += 16) {
        const int64_t count = stop - l < 16 ? stop - l : 16;
        __mmask16 valid = (__mmask16)((1u << count) - 1u);
        if (keep) valid &= _mm_test_epi8_mask(_mm_maskz_loadu_epi8(valid, keep + l), _mm_set1_epi8(-1));
        uint32_t live = 0;
        for (int64_t g = 0; g < group; ++g) {
            __m512 s = scores_block(qrows[g], kbase, k_stride_l, vbase, v_stride_l, l, count, dim, scale, g == 0);
            s = _mm512_mask_blend_ps(valid, _mm512_set1_ps(MASKED), s);
            const float high = _mm512_reduce_max_ps(s);
            if (high > top[g]) {
                /* Nothing summed yet (top still MASKED): the factor is 0 and multiplies zeros. */
                const float factor = top[g] <= MASKED ? 0.0f : expf(top[g] - high);
                const __m512 f = _mm512_set1_ps(factor);
                for (int64_t d = 0; d < dim; d += 16)
                    _mm512_storeu_ps(acc + g * dim + d, _mm512_mul_ps(f, _mm512_loadu_ps(acc + g * dim + d)));
                _mm512_storeu_ps(sums + g * 16, _mm512_mul_ps(f, _mm512_loadu_ps(sums + g * 16)));
                top[g] = high;
            }
            /* Masked lanes weigh exactly 0, and so does every lane while no position counted yet. */
            const __mmask16 counted = top[g] > MASKED ? valid : 0;
            const __m512 w = _mm512_maskz_mov_ps(counted, exp_ps(_mm512_sub_ps(s, _mm512_set1_ps(top[g]))));
            _mm512_storeu_ps(p + g * 16, w);
            _mm512_storeu_ps(sums + g * 16, _mm512_add_ps(_mm512_loadu_ps(sums + g * 16), w));
            live |= counted;
        }
        const uint16_t *vrows = vbase + l * v_stride_l;
        switch (chunks) {
        case 4: values_block(p, vrows, v_stride_l, live, group, 4, 6, acc, dim); break;
        case 8: values_block(p, vrows, v_stride_l, live, group, 8, 3, acc, dim); break;
        case 2: values_block(p, vrows, v_stride_l, live, group, 2, 12, acc, dim); break;
        case 6: values_block(p, vrows, v_stride_l, live, group, 6, 4, acc, dim); break;
        default: values_block(p, vrows, v_stride_l, live, group, chunks, 1, acc, dim); break;
        }
    }
    for (int64_t g = 0; g < group; ++g) {
        const float total = _mm512_reduce_add_ps(_mm512_loadu_ps(sums + g * 16));
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        for (int64_t i = 0; i < dim; ++i) orows[g][slot_dim(i)] = float_to_bf16(acc[g * dim + i] * inv);
    }
}

#endif
#endif
