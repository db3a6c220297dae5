/* A persistent pthread pool: tasks of one job are handed out by an atomic counter; the caller works too. */
#ifndef HK_POOL_H
#define HK_POOL_H

#define HK_MAX_THREADS 256

typedef void (*hk_task_fn)(void *ctx, int task);

/* Run fn(ctx, i) for i in [0, n_tasks) on the pool and the calling thread; returns when all are done.
   Not re-entrant: the caller serialises jobs. */
void hk_pool_run(hk_task_fn fn, void *ctx, int n_tasks);
/* Resize to n threads in all (the caller counts as one). Returns 0, or -1 when a thread could not start
   (the pool then keeps the threads it has). Must not run concurrently with hk_pool_run. */
int hk_pool_set_threads(int n);
int hk_pool_threads(void);
/* Join every worker (module teardown). */
void hk_pool_shutdown(void);

#endif
