/* An int8 product for W8A8 layers on x86 CPUs with AVX512-VNNI, its rescale fused in.
 *
 * out[r][n] = narrow((acc[r][n] - 128 * colsum[n]) * s[r] * w[n] + bias[n]), where
 * acc[r][n] = sum_k a[r][k] * W[n][k], ``a`` the row's levels (int8_quantize.h) shifted to
 * unsigned (level + 128, as VPDPBUSD multiplies unsigned by signed bytes), ``W`` the int8 weight,
 * colsum its row sums (the shift's compensation), s the row's scale, w the weight's per-channel
 * scale, narrow the rounding to bfloat16 (float32: none). The int32 sums are exact, so the result
 * is the integer product
 * whatever the row count or the split over threads.
 *
 * The weight is packed once (``triton_chat_int8_pack``): 16 output channels per tile, for each 4
 * consecutive k the 16 channels' 4 bytes, so one 64-byte load feeds one VPDPBUSD. A block of up to
 * ROWS rows and TILES tiles keeps its sums in registers across k; the OpenMP team splits the tiles.
 * Built with -march=native; on a CPU without AVX512-VNNI ``triton_chat_int8_gemm_available``
 * returns 0 and the caller keeps torch._int_mm.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "int8_quantize.h"

#define ROWS 6
#define TILES 2
#define TILE 16
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

/* Rows [r0, r0 + rows) against tiles [t0, t0 + tiles): sums in registers, then the epilogue. */
static inline __attribute__((always_inline)) void block(const Product *p, int64_t r0, const int rows, int64_t t0,
                                                        const int tiles, int bf16) {
    __m512i acc[ROWS][TILES];
    for (int r = 0; r < rows; ++r)
        for (int t = 0; t < tiles; ++t) acc[r][t] = _mm512_setzero_si512();
    const int64_t groups = p->k / 4;
    const int8_t *b = p->packed + t0 * groups * (TILE * 4);
    const uint8_t *a = p->a + r0 * p->k;
    for (int64_t g = 0; g < groups; ++g) {
        __m512i w[TILES];
        for (int t = 0; t < tiles; ++t) w[t] = _mm512_loadu_si512((const void *)(b + (t * groups + g) * (TILE * 4)));
        for (int r = 0; r < rows; ++r) {
            int32_t four;
            memcpy(&four, a + r * p->k + g * 4, sizeof four);
            const __m512i broadcast = _mm512_set1_epi32(four);
            for (int t = 0; t < tiles; ++t) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], broadcast, w[t]);
        }
    }
    for (int t = 0; t < tiles; ++t) {
        const int64_t c0 = (t0 + t) * TILE;
        const int64_t width = p->n - c0 < TILE ? p->n - c0 : TILE;
        const __mmask16 mask = (__mmask16)((1u << width) - 1u);
        const __m512i comp = _mm512_loadu_si512((const void *)(p->compensation + c0));
        const __m512 cols = _mm512_maskz_loadu_ps(mask, p->col_scales + c0);
        const __m512 bias = p->bias ? _mm512_maskz_loadu_ps(mask, p->bias + c0) : _mm512_setzero_ps();
        for (int r = 0; r < rows; ++r) {
            const float s = p->row_scales[(r0 + r) * p->row_step];
            __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][t], comp));
            v = _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(s)), cols);
            if (p->bias) v = _mm512_add_ps(v, bias);
            if (bf16) {
                float lanes[TILE];
                _mm512_storeu_ps(lanes, v);
                uint16_t *o = (uint16_t *)p->out + (r0 + r) * p->out_stride + c0;
                for (int64_t j = 0; j < width; ++j) o[j] = float_to_bf16(lanes[j]);
            } else {
                _mm512_mask_storeu_ps((float *)p->out + (r0 + r) * p->out_stride + c0, mask, v);
            }
        }
    }
}

#define BLOCK_CASE(R) \
    case R:           \
        if (tiles == TILES) block(p, r0, R, t0, TILES, bf16); else block(p, r0, R, t0, 1, bf16); \
        break;

static void rows_by_tiles(const Product *p, int64_t m, int64_t t0, int tiles, int bf16) {
    for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
        const int rows = m - r0 < ROWS ? (int)(m - r0) : ROWS;
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

/* The input quantized, then multiplied: one parallel region, its two loops split over the team. */
static int product(const void *x, int64_t x_stride, int64_t m, float static_scale, Product *p, int bf16) {
    if (m < 0 || p->n <= 0 || p->k <= 0 || p->k % 4 != 0) return -1;
    if (m == 0) return 0;
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
    const int64_t pairs = (tiles + TILES - 1) / TILES;
#pragma omp parallel if (m * p->n * p->k >= PARALLEL_MACS)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m; ++r) {
            uint8_t *row = levels + r * p->k; /* shifted to unsigned: level + 128 */
            scales[r] = bf16 ? int8_quantize_row_bf16((const uint16_t *)x + r * x_stride, p->k, static_scale, 128, row)
                             : int8_quantize_row_f32((const float *)x + r * x_stride, p->k, static_scale, 128, row);
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < pairs; ++i) {
            const int64_t t0 = i * TILES;
            const int count = tiles - t0 < TILES ? (int)(tiles - t0) : TILES;
            rows_by_tiles(p, m, t0, count, bf16);
        }
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
