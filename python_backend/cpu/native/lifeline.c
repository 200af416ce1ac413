/* A lifeline that needs no Python: a native thread that waits for a parent process to exit, then
 * removes the files it was given (the stub's shared-memory regions), says so on stderr and ends
 * this process.
 *
 * Python's own lifeline (parallel/lifeline.py) must take the GIL once the parent is gone; a stub
 * whose other thread blocks while holding it (a response sent to a tritonserver that no longer
 * reads) then never ends, or Triton's own watchdog ends it first and the regions stay. Here
 * nothing waits on the interpreter. Linux pidfds (5.3+) wake the thread at once; older kernels
 * poll the parent's pid every 200 ms.
 *
 * The files are also removed at exit() when the parent is gone by then: Triton's stub has a
 * watchdog of its own that calls exit(1) once its tritonserver is gone, and on a busy host it can
 * run before this thread does (a region was left so under a full test run on 2 cores). An exit()
 * while the parent lives (an orderly stop) leaves them: tritonserver owns them then.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

typedef struct {
    pid_t parent;
    int status;
    int count;
    char **paths;
    char *message;
} Watch;

static void *watch(void *arg) {
    const Watch *w = arg;
    const int fd = (int)syscall(SYS_pidfd_open, w->parent, 0);
    /* The pid may have been reused before the open: it is ours only while it is still our parent. */
    if (fd >= 0 && getppid() == w->parent) {
        struct pollfd ready = {fd, POLLIN, 0};
        while (poll(&ready, 1, -1) < 0 && errno == EINTR) {
        }
    } else {
        const struct timespec pause = {0, 200 * 1000 * 1000};
        while (getppid() == w->parent) nanosleep(&pause, NULL);
    }
    if (w->message != NULL) {
        const ssize_t written = write(2, w->message, strlen(w->message));
        (void)written; /* nothing to do if stderr is gone too */
    }
    for (int i = 0; i < w->count; ++i) unlink(w->paths[i]);
    _exit(w->status);
    return NULL;
}

/* At exit(): the files go if the process was reparented, that is if its parent has exited. */
static void remove_if_orphaned(int exit_status, void *arg) {
    (void)exit_status;
    const Watch *w = arg;
    if (getppid() == w->parent) return;
    for (int i = 0; i < w->count; ++i) unlink(w->paths[i]);
}

/* A watch of ``parent`` removing copies of ``paths`` (never freed: it lives as long as the
 * process), registered to run at exit(); NULL when out of memory or registering failed. */
static Watch *watch_at_exit(int parent, const char *const *paths, int count, const char *message, int status) {
    Watch *w = calloc(1, sizeof *w);
    if (w == NULL) return NULL;
    w->parent = parent;
    w->status = status;
    w->count = count;
    w->paths = calloc((size_t)(count > 0 ? count : 1), sizeof *w->paths);
    w->message = message != NULL ? strdup(message) : NULL;
    if (w->paths == NULL) return NULL;
    for (int i = 0; i < count; ++i) {
        w->paths[i] = strdup(paths[i]);
        if (w->paths[i] == NULL) return NULL;
    }
    return on_exit(remove_if_orphaned, w) == 0 ? w : NULL;
}

/* Only the exit() half: the files go at exit() if ``parent`` is gone by then. 0, or an errno
 * value. */
int triton_chat_remove_at_exit_if_orphaned(int parent, const char *const *paths, int count) {
    if (parent <= 1 || count < 0) return EINVAL;
    return watch_at_exit(parent, paths, count, NULL, 0) != NULL ? 0 : ENOMEM;
}

/* Starts the watch (and its exit() half); 0 on success, else an errno value (the caller keeps its
 * own lifeline). The strings are copied: the caller's may go. */
int triton_chat_exit_with_parent(int parent, const char *const *paths, int count, const char *message, int status) {
    if (parent <= 1 || count < 0) return EINVAL;
    Watch *w = watch_at_exit(parent, paths, count, message, status);
    if (w == NULL) return ENOMEM;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* Signals stay with the process's other threads: this one only waits. */
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    pthread_t thread;
    const int started = pthread_create(&thread, &attr, watch, w);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    pthread_attr_destroy(&attr);
    return started;
}
