/* Attention whose result for one query depends on that query, its keys and its values only.
 *
 * out[b, i, h, :] = softmax_j(scale * q[b, h, i, :] . k[b, h / group, j, :]) @ v[b, h / group, j, :]
 * over the keys j the query may see: mask[b, i, j] != 0, or, without a mask, j <= length - queries + i
 * (causal, the queries being the last ones). The same function serves prefill (many queries) and
 * decode (one), and every reduction runs in an order fixed by the query's own keys:
 *   - a score is one dot product over the head dimension, in LANES-wide partial sums added by one
 *     fixed tree, then the remainder in order, whatever the key's index;
 *   - the maximum, the sum of exponentials and the weighted sum of values go through the visible
 *     keys in ascending order, one at a time, so padding (masked keys) and the keys other queries
 *     see change nothing;
 *   - work is split over (sequence, head, query) triples: which thread computes a query, and how
 *     many other queries or sequences there are, does not enter its arithmetic.
 * The file is built without -ffast-math (native/build.py), so the compiler keeps that order; the
 * LANES-wide vectors are GCC vector extensions, lowered to whatever SIMD width the CPU has with
 * the same per-lane result. Elements are float32 or bfloat16 (widened exactly, sums in float32,
 * the output rounded to nearest even).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define LANES 16
typedef float lanes_t __attribute__((vector_size(LANES * sizeof(float))));
typedef uint32_t wide_bits_t __attribute__((vector_size(LANES * sizeof(uint32_t))));
typedef uint16_t bf16_bits_t __attribute__((vector_size(LANES * sizeof(uint16_t))));


/* LANES consecutive elements as float32 (bfloat16 widened exactly: its bits are float32's top half). */
static inline lanes_t lanes_f32(const float *p) {
    lanes_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline lanes_t lanes_bf16(const uint16_t *p) {
    bf16_bits_t bits;
    memcpy(&bits, p, sizeof bits);
    const wide_bits_t wide = __builtin_convertvector(bits, wide_bits_t) << 16;
    lanes_t v;
    memcpy(&v, &wide, sizeof v);
    return v;
}

static inline float load_f32(const float *p) { return *p; }
static inline float load_bf16(const uint16_t *p) { return bf16_to_float(*p); }
static inline void store_f32(float *p, float x) { *p = x; }
static inline void store_bf16(uint16_t *p, float x) { *p = float_to_bf16(x); }

/* The sum of the lanes by one fixed tree (halves, then quarters, ...). */
static inline float lane_sum(lanes_t v) {
    float t[LANES];
    memcpy(t, &v, sizeof t);
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int i = 0; i < width; ++i) t[i] = t[i] + t[i + width];
    return t[0];
}

/* q . k for a query widened to float32: LANES-wide partial sums over the first body = dim - dim % LANES
 * elements, added by lane_sum, then the rest in order. */
#define DEFINE_DOT(NAME, T, LOAD, LANES_OF)                                                      \
    static inline float NAME(const float *q, const T *k, int64_t dim, int64_t body) {           \
        lanes_t acc = {0};                                                                       \
        for (int64_t d = 0; d < body; d += LANES) acc = acc + lanes_f32(q + d) * LANES_OF(k + d); \
        float sum = lane_sum(acc);                                                               \
        for (int64_t d = body; d < dim; ++d) sum = sum + q[d] * LOAD(k + d);                     \
        return sum;                                                                              \
    }

DEFINE_DOT(dot_f32, float, load_f32, lanes_f32)
DEFINE_DOT(dot_bf16, uint16_t, load_bf16, lanes_bf16)

/* Returns 0 on success, -1 on bad sizes, -2 when out of memory. */
#define DEFINE_ATTENTION(NAME, T, LOAD, STORE, DOT)                                                         \
    int NAME(const T *q, int64_t q_sb, int64_t q_sh, int64_t q_sq,                                          \
             const T *k, int64_t k_sb, int64_t k_sh, int64_t k_sl,                                          \
             const T *v, int64_t v_sb, int64_t v_sh, int64_t v_sl,                                          \
             const uint8_t *mask, int64_t m_sb, int64_t m_sq,                                               \
             T *out, int64_t o_sb, int64_t o_sq, int64_t o_sh,                                              \
             int64_t batch, int64_t heads, int64_t kv_heads, int64_t queries, int64_t length, int64_t dim, \
             float scale) {                                                                                 \
        if (dim <= 0 || kv_heads <= 0 || heads % kv_heads || length < 0 || queries < 0) return -1;         \
        const int64_t group = heads / kv_heads;                                                             \
        const int64_t body = dim - dim % LANES;                                                             \
        const int64_t tasks = batch * heads * queries;                                                      \
        int status = 0;                                                                                     \
        _Pragma("omp parallel")                                                                             \
        {                                                                                                   \
            /* Per thread: the widened query [dim], the scores [length], the accumulators [dim]. */         \
            float *qrow = malloc(sizeof(float) * (size_t)(2 * dim + (length > 0 ? length : 1)));            \
            float *acc = qrow ? qrow + dim : NULL;                                                          \
            float *scores = qrow ? acc + dim : NULL;                                                        \
            if (qrow == NULL) {                                                                             \
                _Pragma("omp atomic write") status = -2;                                                    \
            }                                                                                               \
            _Pragma("omp for schedule(dynamic, 16)")                                                        \
            for (int64_t task = 0; task < tasks; ++task) {                                                  \
                if (qrow == NULL) continue;                                                                 \
                const int64_t i = task % queries, h = (task / queries) % heads, b = task / (queries * heads); \
                const T *qp = q + b * q_sb + h * q_sh + i * q_sq;                                           \
                const T *kp = k + b * k_sb + (h / group) * k_sh;                                            \
                const T *vp = v + b * v_sb + (h / group) * v_sh;                                            \
                const uint8_t *keep = mask ? mask + b * m_sb + i * m_sq : NULL;                             \
                const int64_t last = mask ? length - 1 : length - queries + i; /* causal limit */           \
                for (int64_t d = 0; d < dim; ++d) qrow[d] = LOAD(qp + d);                                   \
                float top = -INFINITY;                                                                      \
                for (int64_t j = 0; j <= last; ++j) {                                                       \
                    if (keep && !keep[j]) continue;                                                         \
                    const float s = DOT(qrow, kp + j * k_sl, dim, body) * scale;                           \
                    scores[j] = s;                                                                          \
                    if (s > top) top = s;                                                                   \
                }                                                                                           \
                for (int64_t d = 0; d < dim; ++d) acc[d] = 0.0f;                                            \
                float total = 0.0f;                                                                         \
                if (top > -INFINITY) {                                                                      \
                    for (int64_t j = 0; j <= last; ++j) {                                                   \
                        if (keep && !keep[j]) continue;                                                     \
                        const float p = expf(scores[j] - top);                                              \
                        total = total + p;                                                                  \
                        const T *vr = vp + j * v_sl;                                                        \
                        for (int64_t d = 0; d < dim; ++d) acc[d] = acc[d] + p * LOAD(vr + d);               \
                    }                                                                                       \
                }                                                                                           \
                T *orow = out + b * o_sb + i * o_sq + h * o_sh;                                             \
                /* A query that sees no key (a padding row) gets zeros. */                                   \
                for (int64_t d = 0; d < dim; ++d) STORE(orow + d, total > 0.0f ? acc[d] / total : 0.0f);    \
            }                                                                                               \
            free(qrow);                                                                                     \
        }                                                                                                   \
        return status;                                                                                      \
    }

DEFINE_ATTENTION(triton_chat_invariant_attention_f32, float, load_f32, store_f32, dot_f32)
DEFINE_ATTENTION(triton_chat_invariant_attention_bf16, uint16_t, load_bf16, store_bf16, dot_bf16)
