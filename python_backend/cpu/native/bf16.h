/* bfloat16 <-> float32 for the kernels of this folder: widening is exact (bfloat16 is float32's top
 * half); narrowing rounds to nearest even and turns NaN into the quiet NaN, as PyTorch does. */
#ifndef TRITON_CHAT_BF16_H
#define TRITON_CHAT_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

/* Branch-free, so that loops over it vectorize. */
static inline uint16_t float_to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    return (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}

/* ``value`` rounded to bfloat16, as float32. */
static inline float round_bf16(float value) { return bf16_to_float(float_to_bf16(value)); }

#endif
