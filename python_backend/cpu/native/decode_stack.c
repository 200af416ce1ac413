/* A decode step's decoder layers in one call, for Llama/Qwen2 models on CPU: bfloat16 rows with
 * bfloat16 products (``bf16_gemm.c``) or W8A8 int8 ones (``int8_gemm.c``), or float32 rows with
 * W8A8 int8 products (``int8_gemm.c`` or ``int8_gemm_avx2.c``) over a float32 cache or a bfloat16
 * one (``--kv-cache-dtype bfloat16``).
 *
 * The lean decode step (``fast_decode.py``) calls a dozen kernels and PyTorch operations per layer;
 * at one or a few rows each costs more in Python, ctypes and tensor allocation than in work (about
 * 0.2 ms a layer, 6 ms of a 15 ms one-user step of the demo model). This driver runs the same
 * kernels in the same order on buffers allocated once per step: it adds no arithmetic of its own,
 * it only copies the new keys and values into the cache (rounded to nearest even into a bfloat16
 * cache under float32 rows, as PyTorch's copy into it rounds), so its results are bit-identical to
 * the lean step's. The kernels come as function pointers, taken from the libraries the lean step
 * loaded (each keeps the flags it was built with, so the roundings are theirs), each the entry
 * point of the step's row dtype; the driver only needs the element's size (2 or 4 bytes).
 *
 * Per layer, for B rows of one new token each (the residual stream ``hidden`` updated in place):
 *   normed = norm(hidden += pending)            (the first layer: norm(hidden))
 *   qkv    = normed W_qkv + b;  rotated = rope(q, k)
 *   cache[slot] = (rotated k, v);  attn = attention(rotated q, cache window, keep)
 *   normed = norm(hidden += attn W_o + b)
 *   pending = silu_mul(normed W_gate_up + b) W_down + b
 * The caller adds the last ``pending`` in the final norm, or, given the step's ``Ends``, the driver
 * also looks the rows' tokens up in the embedding first and ends with the final norm and the
 * output head's product (the logits): a one-user step's Python around the layers is then one call.
 */
#include <stdint.h>
#include <string.h>

#include "bf16.h"

/* Rows and weights of norms: elements of the step's dtype; caches: of that dtype or bfloat16. Only
 * the kernels read them. */
typedef int (*norm_fn)(const void *x, int64_t x_stride, const void *delta, int64_t delta_stride, void *sum,
                       int64_t sum_stride, const void *weight, void *out, int64_t out_stride, int64_t rows,
                       int64_t dim, float eps);
typedef int (*gemm_fn)(const void *x, int64_t x_stride, int64_t m, int64_t k, const uint16_t *packed, int64_t n,
                       const float *bias, void *out, int64_t out_stride);
typedef int (*rope_fn)(const void *x, int64_t x_stride, const void *cos, const void *sin, void *out, int64_t tokens,
                       int64_t heads, int64_t dim);
typedef int (*attend_fn)(const void *q, int64_t q_stride_b, int64_t q_stride_h, const void *k, int64_t k_stride_b,
                         int64_t k_stride_h, int64_t k_stride_l, const void *v, int64_t v_stride_b,
                         int64_t v_stride_h, int64_t v_stride_l, const uint8_t *mask, int64_t mask_stride_b,
                         void *out, int64_t out_stride_b, int64_t out_stride_h, int64_t batch, int64_t heads,
                         int64_t kv_heads, int64_t length, int64_t dim, float scale);
typedef int (*int8_gemm_fn)(const void *x, int64_t x_stride, int64_t m, int64_t k, float static_scale,
                            const int8_t *packed, const int32_t *compensation, int64_t n, const float *col_scales,
                            const float *bias, void *out, int64_t out_stride);
typedef int (*silu_mul_fn)(const void *gate_up, int64_t gate_up_stride, void *out, int64_t out_stride, int64_t rows,
                           int64_t dim);

typedef struct {
    norm_fn norm;
    gemm_fn gemm; /* bfloat16 products; NULL for float32 rows, or where every product is W8A8 */
    rope_fn rope;
    attend_fn attend;
    silu_mul_fn silu_mul;
    int8_gemm_fn int8_gemm; /* NULL where no layer is W8A8 */
    gemm_fn gemm_silu;      /* a bfloat16 gate/up product ending in silu_mul; NULL where gemm is */
    int8_gemm_fn int8_gemm_silu; /* the same for a W8A8 gate/up product; NULL where int8_gemm is */
} Kernels;

/* One product's weight: bfloat16 packed for ``gemm`` (``compensation`` NULL), or int8 packed for
 * ``int8_gemm`` with its compensation, per-channel scales and the checkpoint's input scale (0:
 * one per row). ``bias`` float32 or NULL. */
typedef struct {
    const void *packed;
    const float *bias;
    const int32_t *compensation;
    const float *col_scales;
    float static_scale;
} Product;

/* One layer's weights (packed for ``gemm``) and its cache window: ``keys``/``values`` point at the
 * window's first position of row 0, kv head 0; positions are ``head_dim`` apart. */
typedef struct {
    const void *input_norm;
    Product qkv;
    Product o;
    const void *post_norm;
    Product gate_up;
    Product down;
    char *keys;
    char *values;
    int64_t cache_stride_b;
    int64_t cache_stride_h;
    float input_eps;
    float post_eps;
    float scaling;
} Layer;

/* What a whole step adds around the layers: each row's token looked up in ``embedding`` ([rows,
 * hidden] of the rows' dtype) into ``hidden``, each row's rotary ``cos``/``sin`` row read from the
 * tables [table_rows, head_dim] at its position, and after the layers ``logits`` [batch, vocab] =
 * head(norm(hidden + pending)) with the final norm's weight and epsilon. */
typedef struct {
    const int64_t *ids;
    const int64_t *positions;
    const void *embedding;
    int64_t embedding_rows;
    const void *cos_table;
    const void *sin_table;
    int64_t table_rows;
    const void *norm;
    float eps;
    Product head;
    int64_t vocab;
    void *logits;
} Ends;

typedef struct {
    int64_t batch;
    int64_t hidden;
    int64_t heads;
    int64_t kv_heads;
    int64_t head_dim;
    int64_t intermediate;
    int64_t length; /* the window's positions, the new one included (the last) */
} Shape;

static inline int product(const Kernels *kn, const Product *p, const void *x, int64_t k, int64_t m, int64_t n,
                          void *out) {
    if (p->compensation == NULL && kn->gemm == NULL) return -98;
    if (p->compensation == NULL) return kn->gemm(x, k, m, k, (const uint16_t *)p->packed, n, p->bias, out, n);
    if (kn->int8_gemm == NULL) return -99;
    return kn->int8_gemm(x, k, m, k, p->static_scale, (const int8_t *)p->packed, p->compensation, n, p->col_scales,
                         p->bias, out, n);
}

/* Elements of scratch ``run_layers`` needs for a shape. */
int64_t triton_chat_decode_stack_scratch(const Shape *s) {
    const int64_t q = s->heads * s->head_dim, kv = s->kv_heads * s->head_dim;
    return s->batch * (s->hidden + (q + 2 * kv) + (q + kv) + q + s->hidden + 2 * s->intermediate + s->intermediate +
                       2 * s->head_dim);
}

/* ``count`` elements of ``from`` (``elem`` bytes each) into the cache at ``to`` (``cache_elem`` bytes
 * each): as they are, or float32 rounded to bfloat16. */
static inline void store(char *to, const char *from, int64_t count, int64_t elem, int64_t cache_elem) {
    if (cache_elem == elem) {
        memcpy(to, from, (size_t)(count * elem));
        return;
    }
    uint16_t *narrow = (uint16_t *)to;
    for (int64_t d = 0; d < count; ++d) {
        float value;
        memcpy(&value, from + d * elem, sizeof value);
        narrow[d] = float_to_bf16(value);
    }
}

/* Returns 0, or the first failing kernel's status (negative), -100 for a bad shape or element
 * size, -101 for a token outside the embedding or -102 for a position outside the rotary tables. ``elem``: the bytes of one element of the rows and
 * norms' weights (2 or 4); ``cache_elem``: of the caches (``elem``, or 2 under float32 rows:
 * ``kn->attend`` then reads a bfloat16 cache). ``ends``: NULL, or the step's embedding lookup and
 * output head (``Ends``). */
int triton_chat_decode_stack(const Kernels *kn, const Layer *layers, int64_t count, const Shape *s, int64_t elem,
                             int64_t cache_elem, void *hidden, void *pending, int first_has_pending, const void *cos,
                             const void *sin, const uint8_t *keep, int64_t keep_stride, void *scratch,
                             const Ends *ends) {
    const int64_t B = s->batch, H = s->hidden, D = s->head_dim, I = s->intermediate;
    const int64_t q_width = s->heads * D, kv_width = s->kv_heads * D, qkv_width = q_width + 2 * kv_width;
    const int64_t rotated_width = q_width + kv_width, slot = s->length - 1;
    if (B <= 0 || s->length <= 0 || H <= 0 || D <= 0 || s->kv_heads <= 0 || s->heads % s->kv_heads) return -100;
    if ((elem != 2 && elem != 4) || (cache_elem != elem && !(elem == 4 && cache_elem == 2))) return -100;
    char *normed = scratch, *qkv = normed + elem * B * H, *rotated = qkv + elem * B * qkv_width;
    char *attn = rotated + elem * B * rotated_width, *o = attn + elem * B * q_width, *gate_up = o + elem * B * H;
    char *act = gate_up + elem * B * 2 * I, *rows_cos = act + elem * B * I, *rows_sin = rows_cos + elem * B * D;
    int status;
#define CALL(expr)                         \
    do {                                   \
        if ((status = (expr)) != 0) return status; \
    } while (0)
    if (ends != NULL) {
        for (int64_t b = 0; b < B; ++b) {
            if (ends->ids[b] < 0 || ends->ids[b] >= ends->embedding_rows) return -101;
            if (ends->positions[b] < 0 || ends->positions[b] >= ends->table_rows) return -102;
        }
        for (int64_t b = 0; b < B; ++b) {
            memcpy((char *)hidden + elem * b * H, (const char *)ends->embedding + elem * ends->ids[b] * H,
                   (size_t)(elem * H));
            const int64_t at = elem * ends->positions[b] * D;
            memcpy(rows_cos + elem * b * D, (const char *)ends->cos_table + at, (size_t)(elem * D));
            memcpy(rows_sin + elem * b * D, (const char *)ends->sin_table + at, (size_t)(elem * D));
        }
        cos = rows_cos;
        sin = rows_sin;
    }
    for (int64_t i = 0; i < count; ++i) {
        const Layer *L = layers + i;
        const int add = i > 0 || first_has_pending;
        CALL(kn->norm(hidden, H, add ? pending : NULL, H, add ? hidden : NULL, H, L->input_norm, normed, H, B, H,
                      L->input_eps));
        CALL(product(kn, &L->qkv, normed, H, B, qkv_width, qkv));
        CALL(kn->rope(qkv, qkv_width, cos, sin, rotated, B, s->heads + s->kv_heads, D));
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < s->kv_heads; ++h) {
                const int64_t at = cache_elem * (b * L->cache_stride_b + h * L->cache_stride_h + slot * D);
                store(L->keys + at, rotated + elem * (b * rotated_width + q_width + h * D), D, elem, cache_elem);
                store(L->values + at, qkv + elem * (b * qkv_width + q_width + kv_width + h * D), D, elem, cache_elem);
            }
        CALL(kn->attend(rotated, rotated_width, D, L->keys, L->cache_stride_b, L->cache_stride_h, D, L->values,
                        L->cache_stride_b, L->cache_stride_h, D, keep, keep_stride, attn, q_width, D, B, s->heads,
                        s->kv_heads, s->length, D, L->scaling));
        CALL(product(kn, &L->o, attn, q_width, B, H, o));
        CALL(kn->norm(hidden, H, o, H, hidden, H, L->post_norm, normed, H, B, H, L->post_eps));
        /* The same bits as the two calls below, without writing gate/up out. */
        if (L->gate_up.compensation == NULL && kn->gemm_silu != NULL && I % 16 == 0) {
            CALL(kn->gemm_silu(normed, H, B, H, (const uint16_t *)L->gate_up.packed, 2 * I, L->gate_up.bias, act, I));
        } else if (L->gate_up.compensation != NULL && kn->int8_gemm_silu != NULL && I % 16 == 0) {
            const Product *p = &L->gate_up;
            CALL(kn->int8_gemm_silu(normed, H, B, H, p->static_scale, (const int8_t *)p->packed, p->compensation, 2 * I,
                                    p->col_scales, p->bias, act, I));
        } else {
            CALL(product(kn, &L->gate_up, normed, H, B, 2 * I, gate_up));
            CALL(kn->silu_mul(gate_up, 2 * I, act, I, B, I));
        }
        CALL(product(kn, &L->down, act, I, B, H, pending));
    }
    if (ends != NULL) {
        const int add = count > 0 || first_has_pending;
        CALL(kn->norm(hidden, H, add ? pending : NULL, H, add ? hidden : NULL, H, ends->norm, normed, H, B, H,
                      ends->eps));
        CALL(product(kn, &ends->head, normed, H, B, ends->vocab, ends->logits));
    }
#undef CALL
    return 0;
}
