/* The next weight panel's prefetch, shared by the block paths of bf16_gemm.c and int8_gemm.c.
 *
 * A thread works through its groups of tiles one after another, every block of rows of a group
 * reading the group's weight panel. The first block would wait on memory for it (one block's
 * arithmetic per byte is too little to hide a core's share of the bandwidth), so while a thread
 * works on one group it requests the next group's panel into L2: each block of rows takes an even
 * slice of it and spreads its requests over its first steps over k. ``TEAM_SHARES`` cuts the
 * threads' shares and their groups.
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

/* Inside an OpenMP parallel region (the including file includes omp.h): splits ``units`` evenly
 * over the team and walks each thread's contiguous share in groups of up to ``per_group`` units, as
 * even as they can be; ``run`` takes a group's first unit, its count and the next group's count (0:
 * none), whose panel ``ahead_panel`` gives. Shares of units, not of groups: shares of whole groups
 * of four split 9 groups 5 to 4, and one thread waited for the other. */
#define TEAM_SHARES(units, per_group, run)                                                           \
    do {                                                                                             \
        const int64_t team = omp_get_num_threads(), id = omp_get_thread_num();                       \
        const int64_t first = (units) * id / team, share = (units) * (id + 1) / team - first;        \
        const int64_t groups = (share + (per_group) - 1) / (per_group);                              \
        for (int64_t i = 0; i < groups; ++i) {                                                       \
            const int64_t u0 = first + share * i / groups;                                           \
            const int count = (int)(first + share * (i + 1) / groups - u0);                          \
            const int64_t after = i + 1 < groups ? first + share * (i + 2) / groups - (u0 + count) : 0; \
            run(u0, count, after);                                                                   \
        }                                                                                            \
    } while (0)

#endif
