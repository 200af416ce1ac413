/* Decode attention (one query row per sequence) over a bfloat16 KV cache, for CPUs.
 *
 * out[b, h, :] = softmax(scale * q[b, h, :] . k[b, h / group, l, :]) @ v[b, h / group, l, :]
 * over the positions l < length where mask[b, l] is non-zero (mask may be NULL: all positions).
 * Keys and values are read in place from the cache's strided views and widened to float32 row by
 * row; scores, softmax and sums are float32; the output is rounded to bfloat16 (nearest even).
 * Work is split over (sequence, KV head) pairs with OpenMP; the G query heads that share a KV head
 * read each key and value row once.
 */
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_DPBF16 1
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Masked positions score this (finite: the file is built with -ffast-math, which assumes no
 * infinities, so that expf vectorizes); exp(MASKED - max) is exactly 0 in float32. */
#define MASKED (-1.0e30f)

static inline float bf16_to_float(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

static inline uint16_t float_to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu)) return 0x7fc0; /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
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
        const size_t floats = (size_t)(group * (length > 0 ? length : 1) + group * dim + dim + 2 * group);
        /* The query-row addresses come first, where malloc's alignment suits pointers. */
        void *block = malloc(sizeof(const uint16_t *) * (size_t)group + sizeof(float) * floats);
        const uint16_t **qrows = (const uint16_t **)block;
        float *scores = block ? (float *)(qrows + group) : NULL;
        if (scores == NULL) {
#pragma omp atomic write
            status = -2;
        }
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < batch; ++b) {
            for (int64_t kh = 0; kh < kv_heads; ++kh) {
                if (scores == NULL) continue;
                float *acc = scores + group * (length > 0 ? length : 1);
                float *row = acc + group * dim;
                float *top = row + dim;
                float *total = top + group;
                const uint8_t *keep = mask ? mask + b * mask_stride_b : NULL;
                for (int64_t g = 0; g < group; ++g) {
                    qrows[g] = q + b * q_stride_b + (kh * group + g) * q_stride_h;
                    top[g] = MASKED;
                    total[g] = 0.0f;
                    memset(acc + g * dim, 0, sizeof(float) * (size_t)dim);
                }
                const uint16_t *kbase = k + b * k_stride_b + kh * k_stride_h;
                for (int64_t l = 0; l < length; ++l) {
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
                for (int64_t g = 0; g < group; ++g) {
                    float *s = scores + g * length;
                    const float m = top[g];
                    float sum = 0.0f;
                    if (m <= MASKED) continue; /* every position masked: output zeros */
#pragma omp simd reduction(+ : sum)
                    for (int64_t l = 0; l < length; ++l) {
                        const float p = expf(s[l] - m); /* a masked score underflows to exactly 0 */
                        s[l] = p;
                        sum += p;
                    }
                    total[g] = sum;
                }
                const uint16_t *vbase = v + b * v_stride_b + kh * v_stride_h;
                for (int64_t l = 0; l < length; ++l) {
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
