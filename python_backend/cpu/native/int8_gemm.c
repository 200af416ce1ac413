/* An int8 product for W8A8 layers on x86 CPUs with AVX512-VNNI, its rescale fused in.
 *
 * out[r][n] = narrow((acc[r][n] - 128 * colsum[n]) * s[r] * w[n] + bias[n]), where
 * acc[r][n] = sum_k a[r][k] * W[n][k], ``a`` the row's levels (int8_quantize.h) shifted to
 * unsigned (level + 128, as VPDPBUSD multiplies unsigned by signed bytes), ``W`` the int8 weight,
 * colsum its row sums (the shift's compensation), s the row's scale, w the weight's per-channel
 * scale, narrow the rounding to bfloat16 (float32: none). The int32 sums are exact, so the result
 * is the integer product whatever the row count, the order of the sums or the split over threads.
 *
 * The weight is packed once (``triton_chat_int8_pack``): 16 output channels per tile, for each 4
 * consecutive k the 16 channels' 4 bytes, so one 64-byte load feeds one VPDPBUSD; a tile's bytes,
 * and the tiles, follow each other in memory. A block of up to ROWS rows and TILES tiles keeps its
 * sums in registers across k; each thread takes an even, contiguous share of the tiles, walks it
 * in pairs and prefetches the next pair's weight while it works on one (ahead.h): at 3 to 16 rows
 * the wait for it was a fifth of the time. Up to STREAM_ROWS rows (a decode
 * step's), the product is a read of the weight and takes the streaming path instead
 * (``stream_product``), which reads it at nearly the memory's bandwidth.
 * Built with -march=native; on a CPU without AVX512-VNNI ``triton_chat_int8_gemm_available``
 * returns 0 and the caller keeps torch._int_mm.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ahead.h"
#include "bf16.h"
#include "int8_quantize.h"

#define ROWS 6
#define TILES 2
#define TILE 16
/* Up to STREAM_ROWS rows of up to STREAM_DEPTH bytes take the streaming path: UNROLL chains of
 * VPDPBUSD per row, and the first BURST bytes of each thread's share requested at once. */
#define STREAM_ROWS 2
#define STREAM_DEPTH 8192
#define UNROLL 4
#define BURST 16384
/* Products worth a parallel region: below this many multiply-adds the team's wake-up costs more. */
#define PARALLEL_MACS (1 << 18)

/* Packs ``w`` [n, k] (k a multiple of 4) into ``packed`` [ceil(n / 16) * 16 * k] and writes
 * ``compensation`` [ceil(n / 16) * 16]: 128 times each channel's sum (0 for the padding). */
int triton_chat_int8_pack(const int8_t *w, int64_t n, int64_t k, int8_t *packed, int32_t *compensation) {
    if (n <= 0 || k <= 0 || k % 4 != 0) return -1;
    const int64_t tiles = (n + TILE - 1) / TILE, groups = k / 4;
    for (int64_t t = 0; t < tiles; ++t) {
        for (int64_t j = 0; j < TILE; ++j) {
            const int64_t channel = t * TILE + j;
            int32_t sum = 0;
            for (int64_t g = 0; g < groups; ++g) {
                int8_t *dst = packed + (t * groups + g) * (TILE * 4) + j * 4;
                for (int b = 0; b < 4; ++b) {
                    const int8_t value = channel < n ? w[channel * k + g * 4 + b] : 0;
                    dst[b] = value;
                    sum += value;
                }
            }
            compensation[channel] = 128 * sum;
        }
    }
    return 0;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#include <omp.h>

int triton_chat_int8_gemm_available(void) { return 1; }

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

/* One row's sums for one tile, rescaled and stored: ``comp``, ``cols`` and ``bias`` are the tile's
 * compensation, column scales and bias (zero without one). */
static inline __attribute__((always_inline)) void store_tile(const Product *p, int64_t r, int64_t c0, __mmask16 mask,
                                                             __m512i sums, __m512i comp, __m512 cols, __m512 bias,
                                                             int bf16) {
    const float s = p->row_scales[r * p->row_step];
    __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums, comp));
    v = _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(s)), cols);
    if (p->bias) v = _mm512_add_ps(v, bias);
    if (bf16) {
        /* float_to_bf16 (bf16.h) on 16 lanes: round to nearest even, NaN to the quiet NaN. */
        const __m512i bits = _mm512_castps_si512(v);
        const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
        const __m512i biased = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), odd);
        __m512i rounded = _mm512_srli_epi32(biased, 16);
        const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7f800000));
        rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc0));
        _mm512_mask_cvtepi32_storeu_epi16((uint16_t *)p->out + r * p->out_stride + c0, mask, rounded);
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

/* Rows [r0, r0 + rows) against tiles [t0, t0 + tiles): sums in registers, then the epilogue. */
static inline __attribute__((always_inline)) void block(const Product *p, int64_t r0, const int rows, int64_t t0,
                                                        const int tiles, int bf16, Ahead ahead) {
    __m512i acc[ROWS][TILES];
    for (int r = 0; r < rows; ++r)
        for (int t = 0; t < tiles; ++t) acc[r][t] = _mm512_setzero_si512();
    const int64_t groups = p->k / 4;
    const int8_t *b = p->packed + t0 * groups * (TILE * 4);
    const uint8_t *a = p->a + r0 * p->k;
#define INT8_STEP(g)                                                                                      \
    do {                                                                                                  \
        __m512i w[TILES];                                                                                 \
        for (int t = 0; t < tiles; ++t)                                                                   \
            w[t] = _mm512_loadu_si512((const void *)(b + (t * groups + (g)) * (TILE * 4)));               \
        for (int r = 0; r < rows; ++r) {                                                                  \
            int32_t four;                                                                                 \
            memcpy(&four, a + r * p->k + (g) * 4, sizeof four);                                           \
            const __m512i broadcast = _mm512_set1_epi32(four);                                            \
            for (int t = 0; t < tiles; ++t) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], broadcast, w[t]);  \
        }                                                                                                 \
    } while (0)
    /* The prefetches ride on the first steps only, so that the loop after them is the plain one (in
     * the same loop, the extra registers slowed long products down by a tenth). */
    const int64_t prefetching = ahead_steps(ahead);
    int64_t g = 0;
    for (; g < groups && g < prefetching; ++g) {
        ahead_request(ahead, g);
        INT8_STEP(g);
    }
    for (; g < groups; ++g) INT8_STEP(g);
#undef INT8_STEP
    /* A copy for the epilogue: with ``acc``'s own address taken, the compiler kept the sums in
     * registers but copied each of them twice per step of the loop above (a third of its time). */
    __m512i sums[ROWS * TILES];
    for (int r = 0; r < rows; ++r)
        for (int t = 0; t < tiles; ++t) sums[r * TILES + t] = acc[r][t];
    epilogue(p, r0, rows, t0, tiles, sums, TILES, bf16);
}

/* Few rows (a decode step's): the product is a read of the weight, so each tile is read front to
 * back on its own (a thread's tiles are then one run of memory read in order, which the hardware
 * prefetchers follow best; two tiles side by side read two runs), with UNROLL chains of VPDPBUSD
 * per row over consecutive groups so that the loads are not held up by one chain's latency. */
static inline __attribute__((always_inline)) void stream_tile(const Product *p, const int rows, int64_t t, int bf16) {
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
    __m512i sums[STREAM_ROWS];
    for (int r = 0; r < rows; ++r) { /* the int32 sums are exact: any order gives the same total */
        sums[r] = acc[r][0];
        for (int u = 1; u < UNROLL; ++u) sums[r] = _mm512_add_epi32(sums[r], acc[r][u]);
    }
    epilogue(p, 0, rows, t, 1, sums, 1, bf16);
}

#define BLOCK_CASE(R)                                        \
    case R:                                                  \
        if (tiles == TILES)                                  \
            block(p, r0, R, t0, TILES, bf16, ahead);         \
        else                                                 \
            block(p, r0, R, t0, 1, bf16, ahead);             \
        break;

/* Rows [0, m) against tiles [t0, t0 + tiles), prefetching the ``next`` panel. */
static void rows_by_tiles(const Product *p, int64_t m, int64_t t0, int tiles, int bf16, Panel next) {
    const int64_t blocks = (m + ROWS - 1) / ROWS;
    for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
        const int rows = m - r0 < ROWS ? (int)(m - r0) : ROWS;
        const Ahead ahead = ahead_slice(next, blocks, r0 / ROWS, p->k / 4);
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
 * thread takes an even, contiguous share of the tiles, requests its first BURST bytes at once (the
 * memory works while the thread quantizes) and quantizes the rows itself into its stack: a
 * row is a few hundred bytes, cheaper to quantize twice than to wait for. */
static int stream_product(const void *x, int64_t x_stride, int64_t m, float static_scale, Product *p, int bf16) {
    const int64_t tiles = (p->n + TILE - 1) / TILE, tile_bytes = p->k * TILE;
    const int rows = (int)m;
#pragma omp parallel if (m * p->n * p->k >= PARALLEL_MACS)
    {
        const int64_t team = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t begin = tiles * id / team, end = tiles * (id + 1) / team;
        const int8_t *first = p->packed + begin * tile_bytes;
        const int64_t burst = (end - begin) * tile_bytes < BURST ? (end - begin) * tile_bytes : BURST;
        for (int64_t offset = 0; offset < burst; offset += 64)
            _mm_prefetch((const char *)(first + offset), _MM_HINT_T0);
        uint8_t levels[STREAM_ROWS * STREAM_DEPTH] __attribute__((aligned(64)));
        float scales[STREAM_ROWS];
        for (int64_t r = 0; r < m; ++r) quantize_rows(x, x_stride, r, static_scale, bf16, levels, scales, p->k);
        Product mine = *p;
        mine.a = levels;
        mine.row_scales = scales;
        mine.row_step = 1;
        for (int64_t t = begin; t < end; ++t) {
            if (rows == 1)
                stream_tile(&mine, 1, t, bf16);
            else
                stream_tile(&mine, STREAM_ROWS, t, bf16);
        }
    }
    return 0;
}

/* The input quantized, then multiplied: one parallel region, the rows split over the team, then
 * each thread's even, contiguous share of the tiles, in pairs (``TEAM_SHARES``). */
static int product(const void *x, int64_t x_stride, int64_t m, float static_scale, Product *p, int bf16) {
    if (m < 0 || p->n <= 0 || p->k <= 0 || p->k % 4 != 0) return -1;
    if (m == 0) return 0;
    if (m <= STREAM_ROWS && p->k <= STREAM_DEPTH) return stream_product(x, x_stride, m, static_scale, p, bf16);
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
    const int64_t tiles = (p->n + TILE - 1) / TILE;
#pragma omp parallel if (m * p->n * p->k >= PARALLEL_MACS)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m; ++r) quantize_rows(x, x_stride, r, static_scale, bf16, levels, scales, p->k);
        /* Every row is quantized here: the loop above ends in a barrier. */
#define TILE_GROUP(t0, count, after) \
    rows_by_tiles(p, m, t0, count, bf16, ahead_panel(p->packed, TILE * p->k, tiles, (t0) + (count), after))
        TEAM_SHARES(tiles, TILES, TILE_GROUP);
#undef TILE_GROUP
    }
    free(levels);
    free(scales);
    return 0;
}

/* out [m, n] = the W8A8 product of x [m, k] (rows ``x_stride`` apart) with the packed weight;
 * ``static_scale`` > 0: the checkpoint's input scale for every row, else one per row. */
#define GEMM(NAME, BF16)                                                                                        \
    int NAME(const void *x, int64_t x_stride, int64_t m, int64_t k, float static_scale, const int8_t *packed, \
             const int32_t *compensation, int64_t n, const float *col_scales, const float *bias, void *out,   \
             int64_t out_stride) {                                                                            \
        Product p = {NULL, k, packed, compensation, n, NULL, 1, col_scales, bias, out, out_stride};           \
        return product(x, x_stride, m, static_scale, &p, BF16);                                               \
    }

#else

int triton_chat_int8_gemm_available(void) { return 0; }

#define GEMM(NAME, BF16)                                                                                        \
    int NAME(const void *x, int64_t x_stride, int64_t m, int64_t k, float static_scale, const int8_t *packed, \
             const int32_t *compensation, int64_t n, const float *col_scales, const float *bias, void *out,   \
             int64_t out_stride) {                                                                            \
        (void)x, (void)x_stride, (void)m, (void)k, (void)static_scale, (void)packed, (void)compensation;      \
        (void)n, (void)col_scales, (void)bias, (void)out, (void)out_stride;                                   \
        return -2;                                                                                            \
    }

#endif

GEMM(triton_chat_int8_gemm_bf16, 1)
GEMM(triton_chat_int8_gemm_f32, 0)
