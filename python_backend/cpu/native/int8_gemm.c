/* An int8 product for W8A8 layers on x86 CPUs with AVX512-VNNI, its rescale fused in.
 *
 * out[r][n] = narrow((acc[r][n] - 128 * colsum[n]) * s[r] * w[n] + bias[n]), where
 * acc[r][n] = sum_k a[r][k] * W[n][k], ``a`` the row's levels (int8_quantize.h) shifted to
 * unsigned (level + 128, as VPDPBUSD multiplies unsigned by signed bytes), ``W`` the int8 weight,
 * colsum its row sums (the shift's compensation), s the row's scale, w the weight's per-channel
 * scale, narrow the rounding to bfloat16 (float32: none). The int32 sums are exact, so the result
 * is the integer product whatever the row count, the order of the sums or the split over threads.
 *
 * The weight is packed once (``triton_chat_int8_pack``, int8_pack.h): 16 output channels per tile,
 * for each 4 consecutive k the 16 channels' 4 bytes, so one 64-byte load feeds one VPDPBUSD; a
 * tile's bytes, and the tiles, follow each other in memory. A block of up to ROWS rows and TILES tiles keeps its
 * sums in registers across k; each thread takes an even, contiguous share of the tiles, walks it
 * in pairs and prefetches the next pair's weight while it works on one (ahead.h): at 3 to 16 rows
 * the wait for it was a fifth of the time. Up to STREAM_ROWS rows (a decode
 * step's), the product is a read of the weight and takes the streaming path instead
 * (``stream_product``), which reads it at nearly the memory's bandwidth.
 * ``triton_chat_int8_gemm_silu_bf16`` is the MLP's merged gate/up product ending in
 * silu(gate) * up (silu_math.h): each gate tile is paired with its up tile, and the product's
 * bfloat16 rounding is followed by ``silu_mul``'s arithmetic, so the product is never written out
 * and read back and the bits are those of the two calls.
 * Built with -march=native; on a CPU without AVX512-VNNI ``triton_chat_int8_gemm_available``
 * returns 0 and the caller loads int8_gemm_avx2.c's product instead, which takes the same packed
 * weight and gives the same bits.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ahead.h"
#include "bf16.h"
#include "int8_pack.h"
#include "int8_quantize.h"
#include "silu_math.h"

#define ROWS 6
#define TILES 2
/* Up to STREAM_ROWS rows of up to STREAM_DEPTH bytes take the streaming path: UNROLL chains of
 * VPDPBUSD per row, and the first BURST bytes of each thread's share requested at once. */
#define STREAM_ROWS 2
#define STREAM_DEPTH 8192
#define UNROLL 4
#define BURST 16384
/* Products worth a parallel region: below this many multiply-adds the team's wake-up costs more. */
#define PARALLEL_MACS (1 << 18)

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#include <omp.h>

int triton_chat_int8_gemm_available(void) { return 1; }
int triton_chat_int8_gemm_fuses_silu(void) { return 1; }

typedef struct {
    const uint8_t *a; /* the levels, [m, k] */
    int64_t k;
    const int8_t *packed;
    const int32_t *compensation;
    int64_t n;
    const float *row_scales;
    int64_t row_step;
    const float *col_scales;
    const float *bias;
    void *out;
    int64_t out_stride;
} Product;

/* One tile's sums for one row, rescaled: ``comp``, ``cols`` and ``bias`` are the tile's compensation,
 * column scales and bias (zero without one). */
static inline __attribute__((always_inline)) __m512 rescaled(const Product *p, int64_t r, __m512i sums, __m512i comp,
                                                            __m512 cols, __m512 bias) {
    __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums, comp));
    v = _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(p->row_scales[r * p->row_step])), cols);
    return p->bias ? _mm512_add_ps(v, bias) : v;
}

/* One row's sums for one tile, rescaled and stored (masked to the tile's ``mask`` of channels). */
static inline __attribute__((always_inline)) void store_tile(const Product *p, int64_t r, int64_t c0, __mmask16 mask,
                                                             __m512i sums, __m512i comp, __m512 cols, __m512 bias,
                                                             int bf16) {
    const __m512 v = rescaled(p, r, sums, comp, cols, bias);
    if (bf16) {
        _mm256_mask_storeu_epi16((uint16_t *)p->out + r * p->out_stride + c0, mask, narrow(v));
    } else {
        _mm512_mask_storeu_ps((float *)p->out + r * p->out_stride + c0, mask, v);
    }
}

/* Rows [r0, r0 + rows) against the tiles of sums ``acc`` ([rows][stride], tile t0 + t at column t). */
static inline __attribute__((always_inline)) void epilogue(const Product *p, int64_t r0, const int rows, int64_t t0,
                                                           const int tiles, const __m512i *acc, const int stride,
                                                           int bf16) {
    for (int t = 0; t < tiles; ++t) {
        const int64_t c0 = (t0 + t) * TILE;
        const int64_t width = p->n - c0 < TILE ? p->n - c0 : TILE;
        const __mmask16 mask = (__mmask16)((1u << width) - 1u);
        const __m512i comp = _mm512_loadu_si512((const void *)(p->compensation + c0));
        const __m512 cols = _mm512_maskz_loadu_ps(mask, p->col_scales + c0);
        const __m512 bias = p->bias ? _mm512_maskz_loadu_ps(mask, p->bias + c0) : _mm512_setzero_ps();
        for (int r = 0; r < rows; ++r) store_tile(p, r0 + r, c0, mask, acc[r * stride + t], comp, cols, bias, bf16);
    }
}

/* Rows [r0, r0 + rows) of the gate tile ``gate`` (sums at column 0 of ``acc``) and its up tile ``up``
 * tiles later (column 1): the product's rounding to bfloat16 of both, then silu(gate) * up as
 * ``silu_mul`` computes it, written at the gate tile's columns of ``out`` (n / 2 wide). */
static inline __attribute__((always_inline)) void silu_epilogue(const Product *p, int64_t r0, const int rows,
                                                                int64_t gate, int64_t up, const __m512i *acc,
                                                                const int stride) {
    const int64_t c0 = gate * TILE, u0 = (gate + up) * TILE;
    const __m512i gate_comp = _mm512_loadu_si512((const void *)(p->compensation + c0));
    const __m512i up_comp = _mm512_loadu_si512((const void *)(p->compensation + u0));
    const __m512 gate_cols = _mm512_loadu_ps(p->col_scales + c0), up_cols = _mm512_loadu_ps(p->col_scales + u0);
    const __m512 gate_bias = p->bias ? _mm512_loadu_ps(p->bias + c0) : _mm512_setzero_ps();
    const __m512 up_bias = p->bias ? _mm512_loadu_ps(p->bias + u0) : _mm512_setzero_ps();
    for (int r = 0; r < rows; ++r) {
        const __m512 g = rescaled(p, r0 + r, acc[r * stride], gate_comp, gate_cols, gate_bias);
        const __m512 u = rescaled(p, r0 + r, acc[r * stride + 1], up_comp, up_cols, up_bias);
        _mm256_storeu_si256((__m256i *)((uint16_t *)p->out + (r0 + r) * p->out_stride + c0),
                            silu_mul_ps(widen_narrowed(g), widen_narrowed(u)));
    }
}

/* Rows [r0, r0 + rows) against tiles [t0, t0 + tiles): sums in registers, then the epilogue. With
 * ``fused`` (a constant at each call site, ``tiles`` 2), tile t0 is a gate tile and the second its
 * up tile, ``up`` tiles after it, and the epilogue writes silu(gate) * up. */
static inline __attribute__((always_inline)) void block(const Product *p, int64_t r0, const int rows, int64_t t0,
                                                        const int tiles, int bf16, Ahead ahead, const int fused,
                                                        int64_t up, Ahead ahead_up) {
    __m512i acc[ROWS][TILES];
    for (int r = 0; r < rows; ++r)
        for (int t = 0; t < tiles; ++t) acc[r][t] = _mm512_setzero_si512();
    const int64_t groups = p->k / 4;
    const int8_t *b = p->packed + t0 * groups * (TILE * 4);
    const uint8_t *a = p->a + r0 * p->k;
    /* Tile t's place in the packed weight, in tiles after t0. */
#define AT(t) ((fused && (t) > 0) ? up : (t))
#define INT8_STEP(g)                                                                                      \
    do {                                                                                                  \
        __m512i w[TILES];                                                                                 \
        for (int t = 0; t < tiles; ++t)                                                                   \
            w[t] = _mm512_loadu_si512((const void *)(b + (AT(t) * groups + (g)) * (TILE * 4)));           \
        for (int r = 0; r < rows; ++r) {                                                                  \
            int32_t four;                                                                                 \
            memcpy(&four, a + r * p->k + (g) * 4, sizeof four);                                           \
            const __m512i broadcast = _mm512_set1_epi32(four);                                            \
            for (int t = 0; t < tiles; ++t) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], broadcast, w[t]);  \
        }                                                                                                 \
    } while (0)
    /* The prefetches ride on the first steps only, so that the loop after them is the plain one (in
     * the same loop, the extra registers slowed long products down by a tenth). */
    int64_t prefetching = ahead_steps(ahead);
    if (fused && ahead_steps(ahead_up) > prefetching) prefetching = ahead_steps(ahead_up);
    int64_t g = 0;
    for (; g < groups && g < prefetching; ++g) {
        ahead_request(ahead, g);
        if (fused) ahead_request(ahead_up, g);
        INT8_STEP(g);
    }
    for (; g < groups; ++g) INT8_STEP(g);
#undef INT8_STEP
#undef AT
    /* A copy for the epilogue: with ``acc``'s own address taken, the compiler kept the sums in
     * registers but copied each of them twice per step of the loop above (a third of its time). */
    __m512i sums[ROWS * TILES];
    for (int r = 0; r < rows; ++r)
        for (int t = 0; t < tiles; ++t) sums[r * TILES + t] = acc[r][t];
    if (fused)
        silu_epilogue(p, r0, rows, t0, up, sums, TILES);
    else
        epilogue(p, r0, rows, t0, tiles, sums, TILES, bf16);
}

/* Few rows (a decode step's): the product is a read of the weight, so each tile is read front to
 * back on its own (a thread's tiles are then one run of memory read in order, which the hardware
 * prefetchers follow best; two tiles side by side read two runs), with UNROLL chains of VPDPBUSD
 * per row over consecutive groups so that the loads are not held up by one chain's latency. */
static inline __attribute__((always_inline)) void stream_sums(const Product *p, const int rows, int64_t t,
                                                              __m512i *sums) {
    __m512i acc[STREAM_ROWS][UNROLL];
    for (int r = 0; r < rows; ++r)
        for (int u = 0; u < UNROLL; ++u) acc[r][u] = _mm512_setzero_si512();
    const int64_t groups = p->k / 4;
    const int8_t *b = p->packed + t * groups * (TILE * 4);
    int64_t g = 0;
    for (; g + UNROLL <= groups; g += UNROLL) {
        __m512i w[UNROLL];
        for (int u = 0; u < UNROLL; ++u) w[u] = _mm512_loadu_si512((const void *)(b + (g + u) * (TILE * 4)));
        for (int r = 0; r < rows; ++r)
            for (int u = 0; u < UNROLL; ++u) {
                int32_t four;
                memcpy(&four, p->a + r * p->k + (g + u) * 4, sizeof four);
                acc[r][u] = _mm512_dpbusd_epi32(acc[r][u], _mm512_set1_epi32(four), w[u]);
            }
    }
    for (; g < groups; ++g) {
        const __m512i w = _mm512_loadu_si512((const void *)(b + g * (TILE * 4)));
        for (int r = 0; r < rows; ++r) {
            int32_t four;
            memcpy(&four, p->a + r * p->k + g * 4, sizeof four);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_set1_epi32(four), w);
        }
    }
    for (int r = 0; r < rows; ++r) { /* the int32 sums are exact: any order gives the same total */
        sums[r] = acc[r][0];
        for (int u = 1; u < UNROLL; ++u) sums[r] = _mm512_add_epi32(sums[r], acc[r][u]);
    }
}

/* Tile ``t`` streamed (``fused``: gate tile ``t`` and its up tile ``up`` tiles later, then SiLU). */
static inline __attribute__((always_inline)) void stream_tile(const Product *p, const int rows, int64_t t, int bf16,
                                                              const int fused, int64_t up) {
    __m512i sums[STREAM_ROWS], up_sums[STREAM_ROWS];
    stream_sums(p, rows, t, sums);
    if (!fused) {
        epilogue(p, 0, rows, t, 1, sums, 1, bf16);
        return;
    }
    stream_sums(p, rows, t + up, up_sums);
    __m512i pairs[STREAM_ROWS * 2];
    for (int r = 0; r < rows; ++r) pairs[2 * r] = sums[r], pairs[2 * r + 1] = up_sums[r];
    silu_epilogue(p, 0, rows, t, up, pairs, 2);
}

#define BLOCK_CASE(R)                                                                 \
    case R:                                                                           \
        if (up > 0)                                                                   \
            block(p, r0, R, t0, TILES, 1, ahead, 1, up, ahead_up);                    \
        else if (tiles == TILES)                                                      \
            block(p, r0, R, t0, TILES, bf16, ahead, 0, 0, none);                      \
        else                                                                          \
            block(p, r0, R, t0, 1, bf16, ahead, 0, 0, none);                          \
        break;

/* Rows [0, m) against tiles [t0, t0 + tiles), prefetching the ``next`` panel; with ``up`` > 0, the
 * gate tile t0 and its up tile ``up`` tiles later (bfloat16 out), prefetching ``next_up`` too. */
static void rows_by_tiles(const Product *p, int64_t m, int64_t t0, int tiles, int bf16, Panel next, int64_t up,
                          Panel next_up) {
    const int64_t blocks = (m + ROWS - 1) / ROWS;
    const Ahead none = {NULL, 0, 0};
    for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
        const int rows = m - r0 < ROWS ? (int)(m - r0) : ROWS;
        const Ahead ahead = ahead_slice(next, blocks, r0 / ROWS, p->k / 4);
        const Ahead ahead_up = up > 0 ? ahead_slice(next_up, blocks, r0 / ROWS, p->k / 4) : none;
        switch (rows) {
            BLOCK_CASE(1)
            BLOCK_CASE(2)
            BLOCK_CASE(3)
            BLOCK_CASE(4)
            BLOCK_CASE(5)
            BLOCK_CASE(6)
        }
    }
}

static void quantize_rows(const void *x, int64_t x_stride, int64_t r, float static_scale, int bf16, uint8_t *levels,
                          float *scales, int64_t k) {
    uint8_t *row = levels + r * k; /* shifted to unsigned: level + 128 */
    scales[r] = bf16 ? int8_quantize_row_bf16((const uint16_t *)x + r * x_stride, k, static_scale, 128, row)
                     : int8_quantize_row_f32((const float *)x + r * x_stride, k, static_scale, 128, row);
}

/* Up to STREAM_ROWS rows: one parallel region without a barrier inside or an allocation. Each
 * thread takes an even, contiguous share of the tiles (``up`` > 0: of the gate tiles, each with its
 * up tile), requests its first BURST bytes at once into L2 (the memory works while the thread
 * quantizes; into L1 the requests outnumber its fill buffers and held the thread up: 4-10 % of
 * the demo model's one-row products) and quantizes the rows itself into its stack: a row is a few
 * hundred bytes, cheaper to quantize twice than to wait for. */
static int stream_product(const void *x, int64_t x_stride, int64_t m, float static_scale, Product *p, int bf16,
                          int64_t up) {
    const int64_t tiles = (p->n + TILE - 1) / TILE, tile_bytes = p->k * TILE, units = up > 0 ? up : tiles;
    const int rows = (int)m;
#pragma omp parallel if (m * p->n * p->k >= PARALLEL_MACS)
    {
        const int64_t team = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t begin = units * id / team, end = units * (id + 1) / team;
        const int runs = up > 0 ? 2 : 1; /* the gate tiles' run of memory and the up tiles' */
        const int64_t burst = (end - begin) * tile_bytes < BURST / runs ? (end - begin) * tile_bytes : BURST / runs;
        for (int run = 0; run < runs; ++run) {
            const int8_t *first = p->packed + (begin + run * up) * tile_bytes;
            for (int64_t offset = 0; offset < burst; offset += 64)
                _mm_prefetch((const char *)(first + offset), _MM_HINT_T1);
        }
        uint8_t levels[STREAM_ROWS * STREAM_DEPTH] __attribute__((aligned(64)));
        float scales[STREAM_ROWS];
        for (int64_t r = 0; r < m; ++r) quantize_rows(x, x_stride, r, static_scale, bf16, levels, scales, p->k);
        Product mine = *p;
        mine.a = levels;
        mine.row_scales = scales;
        mine.row_step = 1;
        for (int64_t t = begin; t < end; ++t) {
            if (up > 0 && rows == 1)
                stream_tile(&mine, 1, t, 1, 1, up);
            else if (up > 0)
                stream_tile(&mine, STREAM_ROWS, t, 1, 1, up);
            else if (rows == 1)
                stream_tile(&mine, 1, t, bf16, 0, 0);
            else
                stream_tile(&mine, STREAM_ROWS, t, bf16, 0, 0);
        }
    }
    return 0;
}

/* The input quantized, then multiplied: one parallel region, the rows split over the team, then
 * each thread's even, contiguous share of the tiles, in pairs (``TEAM_SHARES``); with ``up`` > 0,
 * of the ``up`` gate tiles, each with its up tile ``up`` tiles later. */
static int product(const void *x, int64_t x_stride, int64_t m, float static_scale, Product *p, int bf16,
                   int64_t up) {
    if (m < 0 || p->n <= 0 || p->k <= 0 || p->k % 4 != 0) return -1;
    if (m == 0) return 0;
    if (m <= STREAM_ROWS && p->k <= STREAM_DEPTH) return stream_product(x, x_stride, m, static_scale, p, bf16, up);
    uint8_t *levels = malloc((size_t)(m * p->k));
    float *scales = malloc((size_t)m * sizeof(float));
    if (levels == NULL || scales == NULL) {
        free(levels);
        free(scales);
        return -3;
    }
    p->a = levels;
    p->row_scales = scales;
    p->row_step = 1;
    const int64_t tiles = (p->n + TILE - 1) / TILE, tile_bytes = TILE * p->k;
    const Panel nothing = {NULL, 0};
#pragma omp parallel if (m * p->n * p->k >= PARALLEL_MACS)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m; ++r) quantize_rows(x, x_stride, r, static_scale, bf16, levels, scales, p->k);
        /* Every row is quantized here: the loop above ends in a barrier. */
#define TILE_GROUP(t0, count, after) \
    rows_by_tiles(p, m, t0, count, bf16, ahead_panel(p->packed, tile_bytes, tiles, (t0) + (count), after), 0, nothing)
#define GATE_UP(t0, count, after)                                                                        \
    rows_by_tiles(p, m, t0, 2, 1, ahead_panel(p->packed, tile_bytes, tiles, (t0) + (count), after), up,  \
                  ahead_panel(p->packed, tile_bytes, tiles, (t0) + (count) + up, after))
        if (up > 0)
            TEAM_SHARES(up, 1, GATE_UP);
        else
            TEAM_SHARES(tiles, TILES, TILE_GROUP);
#undef GATE_UP
#undef TILE_GROUP
    }
    free(levels);
    free(scales);
    return 0;
}

#define GEMM(NAME, BF16)                                                                            \
    INT8_GEMM_ENTRY(NAME) {                                                                         \
        Product p = {NULL, k, packed, compensation, n, NULL, 1, col_scales, bias, out, out_stride}; \
        return product(x, x_stride, m, static_scale, &p, BF16, 0);                                  \
    }

/* out [m, n / 2] (bfloat16) = silu(gate) * up, where [gate | up] [m, n] would be the bfloat16
 * product of a merged gate/up weight (n / 2 a multiple of 16): the bits of that product followed by
 * ``silu_mul``. Returns -1 for a bad shape. */
INT8_GEMM_ENTRY(triton_chat_int8_gemm_silu_bf16) {
    if (n <= 0 || n % (2 * TILE) != 0) return -1;
    Product p = {NULL, k, packed, compensation, n, NULL, 1, col_scales, bias, out, out_stride};
    return product(x, x_stride, m, static_scale, &p, 1, n / 2 / TILE);
}

#else

int triton_chat_int8_gemm_available(void) { return 0; }
int triton_chat_int8_gemm_fuses_silu(void) { return 0; }

#define GEMM(NAME, BF16) INT8_GEMM_ABSENT(NAME)
INT8_GEMM_ABSENT(triton_chat_int8_gemm_silu_bf16)

#endif

GEMM(triton_chat_int8_gemm_bf16, 1)
GEMM(triton_chat_int8_gemm_f32, 0)
