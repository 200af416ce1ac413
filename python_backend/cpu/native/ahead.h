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

/* A group's weight panel: ``bytes`` from ``start`` (none: NULL, 0). */
typedef struct {
    const char *start;
    int64_t bytes;
} Panel;

/* Tiles [first, first + group) of ``tiles`` packed ``tile_bytes`` apart from ``packed``, the group
 * cut short at the last tile; none where ``first`` is past it. */
static inline Panel ahead_panel(const void *packed, int64_t tile_bytes, int64_t tiles, int64_t first, int64_t group) {
    if (first >= tiles) return (Panel){NULL, 0};
    const int64_t count = tiles - first < group ? tiles - first : group;
    return (Panel){(const char *)packed + first * tile_bytes, count * tile_bytes};
}

/* Cache lines to request while a block runs: ``count`` lines from ``lines``, ``per_step`` of them
 * with each of the block's first steps over k. */
typedef struct {
    const char *lines;
    int64_t count;
    int64_t per_step;
} Ahead;

/* Block ``index`` of ``blocks``' even slice of ``next``, spread over ``steps`` steps. */
static inline Ahead ahead_slice(Panel next, int64_t blocks, int64_t index, int64_t steps) {
    const int64_t total = (next.bytes + 63) / 64, share = (total + blocks - 1) / blocks, first = index * share;
    if (next.start == NULL || first >= total) return (Ahead){NULL, 0, 0};
    const int64_t count = total - first < share ? total - first : share;
    return (Ahead){next.start + first * 64, count, (count + steps - 1) / steps};
}

/* How many of a block's first steps carry prefetches. */
static inline int64_t ahead_steps(Ahead ahead) {
    return ahead.per_step > 0 ? (ahead.count + ahead.per_step - 1) / ahead.per_step : 0;
}

/* Step ``step``'s requests, into L2 (locality 2: PREFETCHT1 on x86). */
static inline void ahead_request(Ahead ahead, int64_t step) {
    const int64_t first = step * ahead.per_step, end = first + ahead.per_step;
    for (int64_t j = first; j < end && j < ahead.count; ++j) __builtin_prefetch(ahead.lines + j * 64, 0, 2);
}

#endif
