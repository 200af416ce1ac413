/* The W8A8 int8 product of int8_gemm.c for x86 CPUs with AVX2 and no AVX512-VNNI.
 *
 * out[r][n] = narrow(acc[r][n] * s[r] * w[n] + bias[n]), acc[r][n] = sum_k level[r][k] * W[n][k]:
 * the same levels (int8_quantize.h), the same int32 sums and the same epilogue arithmetic as
 * int8_gemm.c, so a row's result is the same bits on either kernel, whatever the row count.
 *
 * AVX2's byte product (VPMADDUBSW) saturates its 16-bit pair sums, so the sums are taken on 16-bit
 * values, exactly: the levels are widened once per call, and each 16-byte quarter of a packed
 * group (four channels by four k, int8_pack.h) is sign-extended and multiplied by VPMADDWD with
 * the row's four levels, which leaves two partial sums per channel; the block adds them up at the
 * end. A block of up to ROWS rows keeps its sums in registers and reads its weight once for them.
 * The weight stays int8 in memory: a decode step's product reads a quarter of the bytes of a
 * float32 layer's. Each thread takes an even, contiguous share of the tiles, and walks
 * the rows in chunks so that a chunk's levels stay in its cache while it passes its tiles.
 * ``triton_chat_int8_gemm_silu_bf16`` is not built here (returns -2): the SiLU arithmetic it
 * shares with silu_mul is AVX-512's.
 * Built with -march=native; on a CPU without AVX2 ``triton_chat_int8_gemm_available`` returns 0.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "int8_pack.h"
#include "int8_quantize.h"

int triton_chat_int8_gemm_fuses_silu(void) { return 0; }

int triton_chat_int8_gemm_silu_bf16(const void *x, int64_t x_stride, int64_t m, int64_t k, float static_scale,
                                    const int8_t *packed, const int32_t *compensation, int64_t n,
                                    const float *col_scales, const float *bias, void *out, int64_t out_stride) {
    (void)x, (void)x_stride, (void)m, (void)k, (void)static_scale, (void)packed, (void)compensation;
    (void)n, (void)col_scales, (void)bias, (void)out, (void)out_stride;
    return -2;
}

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#include <omp.h>

#define ROWS 4
/* Rows per chunk: a chunk's widened levels (CHUNK * k * 2 bytes) stay in L2 across its tiles. */
#define CHUNK 48
/* Up to STREAM_ROWS rows of up to STREAM_DEPTH values take the path without an allocation. */
#define STREAM_ROWS 2
#define STREAM_DEPTH 8192
/* Products worth a parallel region: below this many multiply-adds the team's wake-up costs more. */
#define PARALLEL_MACS (1 << 18)

int triton_chat_int8_gemm_available(void) { return 1; }

typedef struct {
    const int16_t *a; /* the levels widened, [m, k] */
    int64_t k;
    const int8_t *packed;
    int64_t n;
    const float *row_scales;
    const float *col_scales;
    const float *bias;
    void *out;
    int64_t out_stride;
} Product;

/* Eight channels' sums from the pair sums of channels 0-3 (``low``) and 4-7 (``high``): each holds
 * two partial sums per channel, side by side. */
static inline __m256i channel_sums(__m256i low, __m256i high) {
    /* HADD works per 128-bit half: [c0 c1 c4 c5 | c2 c3 c6 c7]; the permute puts them in order. */
    return _mm256_permute4x64_epi64(_mm256_hadd_epi32(low, high), 0xd8);
}

/* Eight float32 lanes rounded to bfloat16 as bf16.h's float_to_bf16 rounds them. */
static inline __m128i narrow8(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
    const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
    const __m256i value = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(value, value), 0xd8);
    return _mm256_castsi256_si128(packed);
}

/* One row's eight channels [c0, c0 + 8) rescaled and stored; ``width`` of them (a tile's last). */
static inline void store8(const Product *p, int64_t r, int64_t c0, int64_t width, __m256i sums, int bf16) {
    if (width <= 0) return;
    const int full = width >= 8;
    float cols_buf[8] = {0}, bias_buf[8] = {0};
    __m256 cols, bias = _mm256_setzero_ps();
    if (full) {
        cols = _mm256_loadu_ps(p->col_scales + c0);
        if (p->bias) bias = _mm256_loadu_ps(p->bias + c0);
    } else {
        memcpy(cols_buf, p->col_scales + c0, (size_t)width * sizeof(float));
        cols = _mm256_loadu_ps(cols_buf);
        if (p->bias) {
            memcpy(bias_buf, p->bias + c0, (size_t)width * sizeof(float));
            bias = _mm256_loadu_ps(bias_buf);
        }
    }
    /* int8_gemm.c's order: (sum * row scale) * column scale, then the bias; no fused multiply-add. */
    __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(p->row_scales[r])), cols);
    if (p->bias) v = _mm256_add_ps(v, bias);
    const int64_t count = full ? 8 : width;
    if (bf16) {
        uint16_t *dst = (uint16_t *)p->out + r * p->out_stride + c0;
        const __m128i narrowed = narrow8(v);
        if (full) {
            _mm_storeu_si128((__m128i *)dst, narrowed);
        } else {
            uint16_t lanes[8];
            _mm_storeu_si128((__m128i *)lanes, narrowed);
            memcpy(dst, lanes, (size_t)count * sizeof(uint16_t));
        }
    } else {
        float *dst = (float *)p->out + r * p->out_stride + c0;
        if (full) {
            _mm256_storeu_ps(dst, v);
        } else {
            float lanes[8];
            _mm256_storeu_ps(lanes, v);
            memcpy(dst, lanes, (size_t)count * sizeof(float));
        }
    }
}

/* Rows [r0, r0 + rows) against ``halves`` halves of tile t from half ``half0`` (a half: 8 channels, two
 * quarters of each packed group): sums in registers, then rescaled and stored. Up to two rows take
 * the whole tile in one pass (8 sums, 4 weight registers); more take a half at a time, so that 4
 * rows' sums, the half's 2 weight registers and the levels fit AVX2's 16 registers (a whole tile
 * of 3 rows spilled 9 of its 12 sums to the stack on every step). */
static inline __attribute__((always_inline)) void block(const Product *p, int64_t r0, const int rows, int64_t t,
                                                        const int half0, const int halves, int bf16) {
    const int q0 = 2 * half0, quarters = 2 * halves;
    __m256i acc[ROWS][4];
    for (int r = 0; r < rows; ++r)
        for (int q = 0; q < quarters; ++q) acc[r][q] = _mm256_setzero_si256();
    const int64_t groups = p->k / 4;
    const int8_t *b = p->packed + t * groups * (TILE * 4) + q0 * 16;
    const int16_t *a = p->a + r0 * p->k;
    for (int64_t g = 0; g < groups; ++g) {
        __m256i levels[ROWS];
        for (int r = 0; r < rows; ++r) {
            int64_t four; /* the row's four levels at k = 4g, as 16-bit values, in every 64-bit lane */
            memcpy(&four, a + r * p->k + g * 4, sizeof four);
            levels[r] = _mm256_set1_epi64x(four);
        }
        for (int q = 0; q < quarters; ++q) {
            const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + g * (TILE * 4) + q * 16)));
            for (int r = 0; r < rows; ++r) acc[r][q] = _mm256_add_epi32(acc[r][q], _mm256_madd_epi16(w, levels[r]));
        }
    }
    /* A copy for the epilogue, as int8_gemm.c's block makes: the sums stay in registers in the loop. */
    __m256i sums[ROWS * 4];
    for (int r = 0; r < rows; ++r)
        for (int q = 0; q < quarters; ++q) sums[r * 4 + q] = acc[r][q];
    for (int r = 0; r < rows; ++r)
        for (int h = 0; h < halves; ++h) {
            const int64_t c0 = t * TILE + (half0 + h) * 8;
            const __m256i channels = channel_sums(sums[r * 4 + 2 * h], sums[r * 4 + 2 * h + 1]);
            store8(p, r0 + r, c0, p->n - c0 < 8 ? p->n - c0 : 8, channels, bf16);
        }
}

/* Rows [r0, r0 + rows) against tile t: two rows or fewer in one pass, more a half tile at a time. */
static inline __attribute__((always_inline)) void rows_block(const Product *p, int64_t r0, const int rows, int64_t t,
                                                             int bf16) {
    if (rows <= 2) {
        block(p, r0, rows, t, 0, 2, bf16);
    } else {
        block(p, r0, rows, t, 0, 1, bf16);
        block(p, r0, rows, t, 1, 1, bf16);
    }
}

/* Rows [r0, r0 + count) against tile t, ROWS at a time. */
static void rows_of_tile(const Product *p, int64_t r0, int64_t count, int64_t t, int bf16) {
    int64_t r = r0;
    for (; r + ROWS <= r0 + count; r += ROWS) rows_block(p, r, ROWS, t, bf16);
    switch (r0 + count - r) {
        case 3:
            rows_block(p, r, 3, t, bf16);
            break;
        case 2:
            rows_block(p, r, 2, t, bf16);
            break;
        case 1:
            rows_block(p, r, 1, t, bf16);
            break;
    }
}

/* Row ``r`` of ``x`` quantized: its signed levels widened to 16 bits into ``levels`` [k]. */
static void quantize_row(const void *x, int64_t x_stride, int64_t r, float static_scale, int bf16, uint8_t *bytes,
                         int16_t *levels, float *scales, int64_t k) {
    scales[r] = bf16 ? int8_quantize_row_bf16((const uint16_t *)x + r * x_stride, k, static_scale, 0, bytes)
                     : int8_quantize_row_f32((const float *)x + r * x_stride, k, static_scale, 0, bytes);
    int64_t d = 0;
    for (; d + 16 <= k; d += 16)
        _mm256_storeu_si256((__m256i *)(levels + d),
                            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(bytes + d))));
    for (; d < k; ++d) levels[d] = (int8_t)bytes[d];
}

/* Up to STREAM_ROWS rows (a decode step's): one parallel region without a barrier or an
 * allocation; each thread quantizes the rows itself into its stack (a row is a few hundred bytes,
 * cheaper to quantize twice than to wait for) and takes an even, contiguous share of the tiles. */
static int stream_product(const void *x, int64_t x_stride, int64_t m, float static_scale, const Product *p, int bf16) {
    const int64_t tiles = (p->n + TILE - 1) / TILE;
#pragma omp parallel if (m * p->n * p->k >= PARALLEL_MACS)
    {
        const int64_t team = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t begin = tiles * id / team, end = tiles * (id + 1) / team;
        int16_t levels[STREAM_ROWS * STREAM_DEPTH] __attribute__((aligned(32)));
        uint8_t bytes[STREAM_DEPTH];
        float scales[STREAM_ROWS];
        for (int64_t r = 0; r < m; ++r)
            quantize_row(x, x_stride, r, static_scale, bf16, bytes, levels + r * p->k, scales, p->k);
        Product mine = *p;
        mine.a = levels;
        mine.row_scales = scales;
        for (int64_t t = begin; t < end; ++t) rows_of_tile(&mine, 0, m, t, bf16);
    }
    return 0;
}

/* The input quantized, then multiplied: one parallel region, the rows split over the team, then
 * each thread's even, contiguous share of the tiles, chunk by chunk of rows. */
static int product(const void *x, int64_t x_stride, int64_t m, float static_scale, Product *p, int bf16) {
    if (m < 0 || p->n <= 0 || p->k <= 0 || p->k % 4 != 0) return -1;
    if (m == 0) return 0;
    if (m <= STREAM_ROWS && p->k <= STREAM_DEPTH) return stream_product(x, x_stride, m, static_scale, p, bf16);
    int16_t *levels = malloc((size_t)(m * p->k) * sizeof(int16_t));
    uint8_t *bytes = malloc((size_t)(m * p->k));
    float *scales = malloc((size_t)m * sizeof(float));
    if (levels == NULL || bytes == NULL || scales == NULL) {
        free(levels);
        free(bytes);
        free(scales);
        return -3;
    }
    p->a = levels;
    p->row_scales = scales;
    const int64_t tiles = (p->n + TILE - 1) / TILE;
#pragma omp parallel if (m * p->n * p->k >= PARALLEL_MACS)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m; ++r)
            quantize_row(x, x_stride, r, static_scale, bf16, bytes + r * p->k, levels + r * p->k, scales, p->k);
        /* Every row is quantized here: the loop above ends in a barrier. */
        const int64_t team = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t begin = tiles * id / team, end = tiles * (id + 1) / team;
        for (int64_t r0 = 0; r0 < m; r0 += CHUNK) {
            const int64_t count = m - r0 < CHUNK ? m - r0 : CHUNK;
            for (int64_t t = begin; t < end; ++t) rows_of_tile(p, r0, count, t, bf16);
        }
    }
    free(levels);
    free(bytes);
    free(scales);
    return 0;
}

#define GEMM(NAME, BF16)                                                            \
    INT8_GEMM_ENTRY(NAME) {                                                         \
        (void)compensation; /* the levels are signed here: nothing to compensate */ \
        Product p = {NULL, k, packed, n, NULL, col_scales, bias, out, out_stride};  \
        return product(x, x_stride, m, static_scale, &p, BF16);                     \
    }

#else

int triton_chat_int8_gemm_available(void) { return 0; }

#define GEMM(NAME, BF16) INT8_GEMM_ABSENT(NAME)

#endif

GEMM(triton_chat_int8_gemm_bf16, 1)
GEMM(triton_chat_int8_gemm_f32, 0)
