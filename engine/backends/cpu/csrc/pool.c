/* The persistent thread pool. Workers spin briefly after a job (decode issues hundreds of small products
   per token, a sleep/wake per product would cost more than the product), then sleep on a condition.
   While jobs come in a steady stream (the last wait was shorter than STREAM_NS: a reply's decode steps, with
   the host's sampling between them) a worker spins longer, LINGER_NS, so the host's work between two steps
   does not put it to sleep and the next step does not pay for waking it (slow in a VM); an idle pool still
   sleeps after LINGER_NS. The spin is counted in the worker's own CPU time: on a loaded machine the time
   slices its sched_yield calls hand to other processes do not use it up.
   Every spin loop yields to the scheduler now and then: on a busy machine the thread being waited for may
   share this core, and a pure spin would keep it off the core for a whole time slice. */
#define _GNU_SOURCE
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdatomic.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_NS 100000     /* how long an idle worker polls before it sleeps */
#define LINGER_NS 2000000  /* how long it polls while jobs are streaming */
#define STREAM_NS 20000000 /* jobs are streaming while a worker's last wait (wall time) was shorter than this */
#define YIELD_EVERY 64  /* polls between two sched_yield calls (a yield costs well under a microsecond) */

static struct {
    int wanted;             /* workers set_threads asked for: respawned lazily in a forked child */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_t threads[HK_MAX_THREADS];
    int n_workers;          /* threads besides the caller */
    atomic_int generation;  /* bumped once per job, and once to stop */
    atomic_int next_task;
    atomic_int busy;        /* workers not yet done with the current job */
    atomic_int stop;
    hk_task_fn fn;
    void *ctx;
    int n_tasks;
} P = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void run_tasks(void) {
    for (;;) {
        int i = atomic_fetch_add_explicit(&P.next_task, 1, memory_order_relaxed);
        if (i >= P.n_tasks) return;
        P.fn(P.ctx, i);
    }
}

/* Wait until the generation moves past seen, polling for spin_ns of this thread's CPU time first; returns
   the new generation. */
static int wait_for_job(int seen, long long spin_ns) {
    long long deadline = thread_cpu_ns() + spin_ns;
    for (int spins = 0;; spins++) {
        int g = atomic_load_explicit(&P.generation, memory_order_acquire);
        if (g != seen) return g;
        CPU_RELAX();
        if (spins % YIELD_EVERY == YIELD_EVERY - 1) {
            sched_yield();
            if (thread_cpu_ns() > deadline) break;
        }
    }
    pthread_mutex_lock(&P.mu);
    int g;
    while ((g = atomic_load_explicit(&P.generation, memory_order_acquire)) == seen) pthread_cond_wait(&P.wake, &P.mu);
    pthread_mutex_unlock(&P.mu);
    return g;
}

static void *worker(void *arg) {
    int seen = (int)(intptr_t)arg;
    long long spin_ns = SPIN_NS;
    for (;;) {
        long long idle_since = now_ns();
        seen = wait_for_job(seen, spin_ns);
        spin_ns = now_ns() - idle_since < STREAM_NS ? LINGER_NS : SPIN_NS;
        if (atomic_load_explicit(&P.stop, memory_order_acquire)) return NULL;
        run_tasks();
        atomic_fetch_sub_explicit(&P.busy, 1, memory_order_release);
    }
}

static void after_fork_in_child(void);
static void register_fork_handler(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

static int spawn(int n_workers) {
    int g = atomic_load_explicit(&P.generation, memory_order_acquire);
    for (int i = 0; i < n_workers; i++) {
        if (pthread_create(&P.threads[i], NULL, worker, (void *)(intptr_t)g) != 0) return -1;
        P.n_workers = i + 1;
    }
    return 0;
}

/* In a forked child only the forking thread exists: forget the parent's workers (their state is
   copied but they are not running) and start new ones on the next job. */
static void after_fork_in_child(void) {
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.wake, NULL);
    P.n_workers = 0;
    atomic_store_explicit(&P.stop, 0, memory_order_relaxed);
}

void hk_pool_run(hk_task_fn fn, void *ctx, int n_tasks) {
    if (P.n_workers == 0 && P.wanted > 0 && n_tasks > 1 && spawn(P.wanted) != 0) /* first job after a fork */
        P.wanted = P.n_workers; /* run on the threads that started */
    if (P.n_workers == 0 || n_tasks <= 1) {
        for (int i = 0; i < n_tasks; i++) fn(ctx, i);
        return;
    }
    P.fn = fn;
    P.ctx = ctx;
    P.n_tasks = n_tasks;
    atomic_store_explicit(&P.next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&P.busy, P.n_workers, memory_order_relaxed);
    pthread_mutex_lock(&P.mu); /* under the mutex so a worker about to sleep cannot miss the wake-up */
    atomic_fetch_add_explicit(&P.generation, 1, memory_order_release);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
    run_tasks();
    for (int spins = 0; atomic_load_explicit(&P.busy, memory_order_acquire) > 0; spins++) {
        CPU_RELAX();
        if (spins % YIELD_EVERY == YIELD_EVERY - 1) sched_yield();
    }
}

void hk_pool_shutdown(void) {
    if (P.n_workers == 0) return;
    pthread_mutex_lock(&P.mu);
    atomic_store_explicit(&P.stop, 1, memory_order_release);
    atomic_fetch_add_explicit(&P.generation, 1, memory_order_release);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
    for (int i = 0; i < P.n_workers; i++) pthread_join(P.threads[i], NULL);
    P.n_workers = 0;
    atomic_store_explicit(&P.stop, 0, memory_order_release);
}

int hk_pool_set_threads(int n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork_handler);
    if (n < 1) n = 1;
    if (n > HK_MAX_THREADS) n = HK_MAX_THREADS;
    if (n - 1 == P.n_workers) return 0;
    hk_pool_shutdown();
    P.wanted = n - 1;
    if (spawn(n - 1) != 0) {
        P.wanted = P.n_workers;
        return -1;
    }
    return 0;
}

int hk_pool_threads(void) { return P.wanted + 1; }
