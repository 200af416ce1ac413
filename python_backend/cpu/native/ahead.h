/* The next weight panel's prefetch, shared by the block paths of bf16_gemm.c and int8_gemm.c.
 *
 * A thread works through its groups of tiles one after another, every block of rows of a group
 * reading the group's weight panel. The first block would wait on memory for it (one block's
 * arithmetic per byte is too little to hide a core's share of the bandwidth), so while a thread
 * works on one group it requests the next group's panel into L2: each block of rows takes an even
 * slice of it and spreads its requests over its first steps over k.
 */
#ifndef TRITON_CHAT_AHEAD_H
#define TRITON_CHAT_AHEAD_H

#include <stdint.h>

/* Cache lines to request while a block runs: ``count`` lines from ``lines``, ``per_step`` of them
 * with each of the block's first steps over k. */
typedef struct {
    const char *lines;
    int64_t count;
    int64_t per_step;
} Ahead;

/* Block ``index`` of ``blocks``' even slice of the ``bytes`` at ``next`` (NULL: none), spread over
 * ``steps`` steps. */
static inline Ahead ahead_slice(const char *next, int64_t bytes, int64_t blocks, int64_t index, int64_t steps) {
    const int64_t total = (bytes + 63) / 64, share = (total + blocks - 1) / blocks, first = index * share;
    if (next == NULL || first >= total) return (Ahead){NULL, 0, 0};
    const int64_t count = total - first < share ? total - first : share;
    return (Ahead){next + first * 64, count, (count + steps - 1) / steps};
}

/* How many of a block's first steps carry prefetches. */
static inline int64_t ahead_steps(Ahead ahead) {
    return ahead.per_step > 0 ? (ahead.count + ahead.per_step - 1) / ahead.per_step : 0;
}

#endif
