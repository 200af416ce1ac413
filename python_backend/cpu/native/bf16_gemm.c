/* A bfloat16 product for linear layers on x86 CPUs with AVX512-BF16 (and no AMX).
 *
 * out[r][n] = narrow(sum_k x[r][k] * W[n][k] + bias[n]): float32 sums of bfloat16 pairs
 * (VDPBF16PS), the bias added in float32, narrow the rounding to bfloat16 (to nearest even).
 * Every row is summed in the same order, pair after pair over k, whatever the row count or the
 * split over threads: a row's result does not depend on the rows beside it.
 *
 * The weight is packed once (``triton_chat_bf16_pack``): 16 output channels per tile, for each pair
 * of consecutive k the 16 channels' two values, so one 64-byte load feeds one VDPBF16PS. A block
 * of up to ROWS rows and TILES tiles keeps its sums in registers across k; each thread of the
 * OpenMP team takes an even, contiguous share of the tiles, walks it in groups of up to TILES
 * tiles and prefetches the next group's weight while it works on one (ahead.h): at 16 rows the
 * wait for it was a fifth of the time. oneDNN's own product costs about 17 us per call before any
 * work, a third of a small layer's one-row product; this call costs a few.
 * ``triton_chat_bf16_gemm_silu`` is the MLP's merged gate/up product ending in silu(gate) * up
 * (silu_math.h), so that the product is never written out and read back.
 * Built with -march=native; on a CPU without AVX512-BF16 ``triton_chat_bf16_gemm_available``
 * returns 0 and the caller keeps oneDNN.
 */
#include <stdint.h>
#include <string.h>

#include "ahead.h"
#include "silu_math.h"

#define ROWS 6
#define TILES 4
#define TILE 16
/* Products worth a parallel region: below this many multiply-adds the team's wake-up costs more. */
#define PARALLEL_MACS (1 << 17)

/* Packs ``w`` [n, k] (k even) into ``packed`` [ceil(n / 16) * 16 * k], zeros for the padding. */
int triton_chat_bf16_pack(const uint16_t *w, int64_t n, int64_t k, uint16_t *packed) {
    if (n <= 0 || k <= 0 || k % 2 != 0) return -1;
    const int64_t tiles = (n + TILE - 1) / TILE, pairs = k / 2;
    for (int64_t t = 0; t < tiles; ++t)
        for (int64_t j = 0; j < TILE; ++j) {
            const int64_t channel = t * TILE + j;
            for (int64_t p = 0; p < pairs; ++p) {
                uint16_t *dst = packed + (t * pairs + p) * (TILE * 2) + j * 2;
                dst[0] = channel < n ? w[channel * k + 2 * p] : 0;
                dst[1] = channel < n ? w[channel * k + 2 * p + 1] : 0;
            }
        }
    return 0;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <omp.h>

int triton_chat_bf16_gemm_available(void) { return 1; }

typedef struct {
    const uint16_t *x;
    int64_t x_stride;
    int64_t k;
    const uint16_t *packed;
    int64_t n;
    const float *bias;
    uint16_t *out;
    int64_t out_stride;
} Product;

/* Rows [r0, r0 + rows) against ``tiles`` tiles from t0 on. With ``fused`` (a constant at each call
 * site), the block's first half of tiles are gate tiles and the second half the up tiles ``up``
 * tiles after them, and the epilogue writes silu(gate) * up. */
static inline __attribute__((always_inline)) void block(const Product *p, int64_t r0, const int rows, int64_t t0,
                                                        const int tiles, Ahead ahead, const int fused, int64_t up,
                                                        Ahead ahead_up) {
    __m512 acc[ROWS][TILES];
    for (int r = 0; r < rows; ++r)
        for (int t = 0; t < tiles; ++t) acc[r][t] = _mm512_setzero_ps();
    const int64_t pairs = p->k / 2;
    const int half = tiles / 2;
    const uint16_t *b = p->packed + t0 * pairs * (TILE * 2);
    const uint16_t *x = p->x + r0 * p->x_stride;
    /* Tile t's place in the packed weight, in tiles after t0. */
#define AT(t) ((fused && (t) >= half) ? (t) - half + up : (t))
#define BF16_STEP(q)                                                                                      \
    do {                                                                                                  \
        __m512bh w[TILES];                                                                                \
        for (int t = 0; t < tiles; ++t)                                                                   \
            w[t] = (__m512bh)_mm512_loadu_si512((const void *)(b + (AT(t) * pairs + (q)) * (TILE * 2)));  \
        for (int r = 0; r < rows; ++r) {                                                                  \
            int32_t two;                                                                                  \
            memcpy(&two, x + r * p->x_stride + 2 * (q), sizeof two);                                      \
            const __m512bh broadcast = (__m512bh)_mm512_set1_epi32(two);                                  \
            for (int t = 0; t < tiles; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], broadcast, w[t]);     \
        }                                                                                                 \
    } while (0)
    /* The prefetches ride on the first steps only, so that the loop after them is the plain one (in
     * the same loop, the extra registers slowed long products down). */
    int64_t prefetching = ahead_steps(ahead);
    if (fused && ahead_steps(ahead_up) > prefetching) prefetching = ahead_steps(ahead_up);
    int64_t q = 0;
    for (; q < pairs && q < prefetching; ++q) {
        ahead_request(ahead, q);
        if (fused) ahead_request(ahead_up, q);
        BF16_STEP(q);
    }
    for (; q < pairs; ++q) BF16_STEP(q);
#undef BF16_STEP
    if (!fused) {
        for (int t = 0; t < tiles; ++t) {
            const int64_t c0 = (t0 + t) * TILE;
            const int64_t width = p->n - c0 < TILE ? p->n - c0 : TILE;
            const __mmask16 mask = (__mmask16)((1u << width) - 1u);
            const __m512 bias = p->bias ? _mm512_maskz_loadu_ps(mask, p->bias + c0) : _mm512_setzero_ps();
            for (int r = 0; r < rows; ++r) {
                const __m512 v = p->bias ? _mm512_add_ps(acc[r][t], bias) : acc[r][t];
                const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(v);
                _mm256_mask_storeu_epi16(p->out + (r0 + r) * p->out_stride + c0, mask, rounded);
            }
        }
        return;
    }
    /* The product's own rounding of gate and up to bfloat16, then silu_math.h's silu(gate) * up:
     * the bits of the product followed by silu.c's ``silu_mul``. */
    for (int t = 0; t < half; ++t) {
        const int64_t c0 = (t0 + t) * TILE, u0 = (t0 + up + t) * TILE;
        const __m512 gate_bias = p->bias ? _mm512_loadu_ps(p->bias + c0) : _mm512_setzero_ps();
        const __m512 up_bias = p->bias ? _mm512_loadu_ps(p->bias + u0) : _mm512_setzero_ps();
        for (int r = 0; r < rows; ++r) {
            const __m512 g = p->bias ? _mm512_add_ps(acc[r][t], gate_bias) : acc[r][t];
            const __m512 u = p->bias ? _mm512_add_ps(acc[r][t + half], up_bias) : acc[r][t + half];
            const __m256i v =
                silu_mul_ps(widen((__m256i)_mm512_cvtneps_pbh(g)), widen((__m256i)_mm512_cvtneps_pbh(u)));
            _mm256_storeu_si256((__m256i *)(p->out + (r0 + r) * p->out_stride + c0), v);
        }
    }
#undef AT
}

#define TILE_CASES(R)                                                        \
    switch (tiles) {                                                         \
        case 4: block(p, r0, R, t0, 4, ahead, 0, 0, none); break;            \
        case 3: block(p, r0, R, t0, 3, ahead, 0, 0, none); break;            \
        case 2: block(p, r0, R, t0, 2, ahead, 0, 0, none); break;            \
        default: block(p, r0, R, t0, 1, ahead, 0, 0, none); break;           \
    }
#define FUSED_CASES(R)                                                       \
    switch (tiles) {                                                         \
        case 4: block(p, r0, R, t0, 4, ahead, 1, up, ahead_up); break;       \
        default: block(p, r0, R, t0, 2, ahead, 1, up, ahead_up); break;      \
    }
#define ROW_CASES(CASES)                  \
    switch (rows) {                       \
        case 1: CASES(1) break;           \
        case 2: CASES(2) break;           \
        case 3: CASES(3) break;           \
        case 4: CASES(4) break;           \
        case 5: CASES(5) break;           \
        default: CASES(6) break;          \
    }

/* Rows [0, m) against ``tiles`` tiles from t0 (``up`` 0), or against ``tiles`` / 2 gate tiles from t0
 * and as many up tiles ``up`` tiles after them; prefetching the ``next`` panels. */
static void rows_by_tiles(const Product *p, int64_t m, int64_t t0, int tiles, Panel next, int64_t up,
                          Panel next_up) {
    const int64_t blocks = (m + ROWS - 1) / ROWS;
    const Ahead none = {NULL, 0, 0};
    for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
        const int rows = m - r0 < ROWS ? (int)(m - r0) : ROWS;
        const Ahead ahead = ahead_slice(next, blocks, r0 / ROWS, p->k / 2);
        if (up == 0) {
            ROW_CASES(TILE_CASES)
        } else {
            const Ahead ahead_up = ahead_slice(next_up, blocks, r0 / ROWS, p->k / 2);
            ROW_CASES(FUSED_CASES)
        }
    }
}

/* out [m, n] (rows ``out_stride`` apart) = x [m, k] (rows ``x_stride`` apart) times the packed
 * weight, plus ``bias`` (float32 [n] or NULL). */
int triton_chat_bf16_gemm(const uint16_t *x, int64_t x_stride, int64_t m, int64_t k, const uint16_t *packed,
                          int64_t n, const float *bias, uint16_t *out, int64_t out_stride) {
    if (m < 0 || n <= 0 || k <= 0 || k % 2 != 0) return -1;
    if (m == 0) return 0;
    const Product p = {x, x_stride, k, packed, n, bias, out, out_stride};
    const int64_t tiles = (n + TILE - 1) / TILE, tile_bytes = TILE * k * 2;
    /* Each thread takes an even share of the tiles, not of the groups: with 36 or 60 tiles (the
     * 576- and 960-channel products of a small model), groups of four split 5 to 4 or 8 to 7 and
     * one thread waited for the other. One or two rows read the weight at the memory's pace
     * already: no prefetch there. */
#define PLAIN(t0, count, after)                                                                                \
    rows_by_tiles(&p, m, t0, count, m > 2 ? ahead_panel(packed, tile_bytes, tiles, (t0) + (count), after)      \
                                          : (Panel){NULL, 0},                                                  \
                  0, (Panel){NULL, 0})
#pragma omp parallel if (m * n * k >= PARALLEL_MACS)
    TEAM_SHARES(tiles, TILES, PLAIN);
#undef PLAIN
    return 0;
}

/* out [m, n / 2] = silu(gate) * up, where [gate | up] [m, n] would be ``triton_chat_bf16_gemm``'s
 * result for a merged gate/up weight (n / 2 a multiple of 16): each block pairs gate tiles with
 * their up tiles, so the merged product is never written out. Returns -1 for a bad shape. */
int triton_chat_bf16_gemm_silu(const uint16_t *x, int64_t x_stride, int64_t m, int64_t k, const uint16_t *packed,
                               int64_t n, const float *bias, uint16_t *out, int64_t out_stride) {
    if (m < 0 || n <= 0 || k <= 0 || k % 2 != 0 || n % (2 * TILE) != 0) return -1;
    if (m == 0) return 0;
    const Product p = {x, x_stride, k, packed, n, bias, out, out_stride};
    const int64_t up = n / 2 / TILE, tiles = 2 * up, tile_bytes = TILE * k * 2;
    /* A unit is a gate tile and its up tile; a group, up to TILES / 2 of them. */
#define FUSED(t0, count, after)                                                                          \
    rows_by_tiles(&p, m, t0, 2 * (count),                                                                \
                  m > 2 ? ahead_panel(packed, tile_bytes, tiles, (t0) + (count), after) : (Panel){NULL, 0}, up, \
                  m > 2 ? ahead_panel(packed, tile_bytes, tiles, (t0) + (count) + up, after) : (Panel){NULL, 0})
#pragma omp parallel if (m * n * k >= PARALLEL_MACS)
    TEAM_SHARES(up, TILES / 2, FUSED);
#undef FUSED
    return 0;
}

#else

int triton_chat_bf16_gemm_available(void) { return 0; }

int triton_chat_bf16_gemm(const uint16_t *x, int64_t x_stride, int64_t m, int64_t k, const uint16_t *packed,
                          int64_t n, const float *bias, uint16_t *out, int64_t out_stride) {
    (void)x, (void)x_stride, (void)m, (void)k, (void)packed, (void)n, (void)bias, (void)out, (void)out_stride;
    return -2;
}

int triton_chat_bf16_gemm_silu(const uint16_t *x, int64_t x_stride, int64_t m, int64_t k, const uint16_t *packed,
                               int64_t n, const float *bias, uint16_t *out, int64_t out_stride) {
    (void)x, (void)x_stride, (void)m, (void)k, (void)packed, (void)n, (void)bias, (void)out, (void)out_stride;
    return -2;
}

#endif
