/* The sampler's draw over a vector of logits, shared by sampling.c's bindings (sample_vocabulary over a whole
   vocabulary, sample_top_k over top-k's candidates). */
#ifndef HK_SAMPLING_DRAW_H
#define HK_SAMPLING_DRAW_H

#include <stddef.h>
#include <stdint.h>

typedef float hk_v4 __attribute__((vector_size(16))); /* GCC/Clang vectors: SSE2 or NEON, no ISA dispatch */
typedef int32_t hk_i4 __attribute__((vector_size(16)));
typedef double hk_d2 __attribute__((vector_size(16)));

#define HK_BLOCK 512 /* the draw's ids per block: block sums first, then a running sum inside one block */

typedef struct {
    const float *z;  /* (n,) the logits with the penalised ones replaced */
    float *w;        /* (n,) scratch: the weights */
    double *cdf;     /* (n / HK_BLOCK + 1,) the running sums of the draw's block weights */
    int32_t *cand;   /* (n,) */
    int32_t *group;  /* (n,) */
    int64_t n;
} hk_draw_work;

/* This thread's scratch of at least size bytes, kept from call to call; NULL when out of memory. */
char *hk_thread_scratch(size_t size);

/* The highest of x[0:n]; *bad = 1 if any is NaN. */
float hk_max_checked(const float *x, int64_t n, int *bad);

/* Top-p (< 1), min-p (> 0), temperature (> 0) and the inverse-CDF draw at u in [0, 1) over d->z[0:n] (ties at the
   nucleus boundary keep the lower indices); returns the drawn index with *logprob its log-probability under the
   final distribution, or -1 when NaN or +inf is among the logits or nothing finite is left. */
int64_t hk_draw(const hk_draw_work *d, double top_p, double min_p, double temperature, double u, double *logprob);

#endif
