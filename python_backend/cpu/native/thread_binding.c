/* Pinning the calling thread's OpenMP team, one thread per CPU.
 *
 * Runs one parallel region on the caller's team (the same team torch uses on that thread: the
 * library shares torch's libgomp, see build.py); thread t of the team binds itself to cpus[t].
 * Returns how many threads were bound, or -1 if the team is larger than the list of CPUs.
 */
#define _GNU_SOURCE
#include <omp.h>
#include <sched.h>

int triton_chat_bind_team(const int *cpus, int count) {
    int bound = 0;
    if (omp_get_max_threads() > count) {
        return -1;
    }
#pragma omp parallel reduction(+ : bound)
    {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[omp_get_thread_num()], &set);
        bound += sched_setaffinity(0, sizeof(set), &set) == 0;
    }
    return bound;
}
