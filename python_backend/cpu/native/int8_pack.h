/* The packed layout of an int8 weight, shared by int8_gemm.c (VPDPBUSD) and int8_gemm_avx2.c
 * (VPMADDWD): 16 output channels per tile, for each 4 consecutive k the 16 channels' 4 bytes (one
 * 64-byte load feeds one VPDPBUSD; four 16-byte quarters, four channels each, feed VPMADDWD), a
 * tile's bytes, and the tiles, one after another. Each including file is its own library, so the
 * packing function is defined here once for both, with the products' common signature.
 */
#ifndef TRITON_CHAT_INT8_PACK_H
#define TRITON_CHAT_INT8_PACK_H

#include <stdint.h>

#define TILE 16

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

/* A product's entry: out [m, n] = the W8A8 product of x [m, k] (rows ``x_stride`` apart) with the
 * packed weight and its ``compensation``; ``static_scale`` > 0: the checkpoint's input scale for
 * every row, else one per row. Returns 0, -1 for a bad shape, -3 when out of memory. */
#define INT8_GEMM_ENTRY(NAME)                                                                                 \
    int NAME(const void *x, int64_t x_stride, int64_t m, int64_t k, float static_scale, const int8_t *packed, \
             const int32_t *compensation, int64_t n, const float *col_scales, const float *bias, void *out,   \
             int64_t out_stride)

/* The entry in a library built for a CPU without the file's instructions: -2, read as absent. */
#define INT8_GEMM_ABSENT(NAME)                                                                           \
    INT8_GEMM_ENTRY(NAME) {                                                                              \
        (void)x, (void)x_stride, (void)m, (void)k, (void)static_scale, (void)packed, (void)compensation; \
        (void)n, (void)col_scales, (void)bias, (void)out, (void)out_stride;                              \
        return -2;                                                                                       \
    }

#endif
