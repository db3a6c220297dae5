/* The sampler's draw over a vector of logits (a whole vocabulary, or top-k's candidates): top-p by a radix select
   on the weights' bits (or a running sum when the weights are already sorted), min-p, temperature and the
   inverse-CDF draw in a few vector passes; with no Python in it, for sampling.c's bindings. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sampling_draw.h"
#include "vecops.h"

/* This thread's scratch of at least size bytes, kept from call to call (fresh pages of a new allocation fault
   in, one by one, every token); NULL when out of memory. Freed when the thread ends. */
static pthread_key_t SCRATCH_KEY;
static pthread_once_t SCRATCH_ONCE = PTHREAD_ONCE_INIT;

typedef struct {
    size_t size;
    char *data;
} hk_scratch;

static void scratch_free(void *p) {
    free(((hk_scratch *)p)->data);
    free(p);
}

static void scratch_key(void) { pthread_key_create(&SCRATCH_KEY, scratch_free); }

char *hk_thread_scratch(size_t size) {
    pthread_once(&SCRATCH_ONCE, scratch_key);
    hk_scratch *s = pthread_getspecific(SCRATCH_KEY);
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        if (pthread_setspecific(SCRATCH_KEY, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->size < size) {
        free(s->data);
        s->data = malloc(size);
        s->size = s->data ? size : 0;
    }
    return s->data;
}

#define HK_TINY 0x1p-125f /* a weight below this (e^-86.6 of the best token's) counts as 0, as in vector_math.py */

static inline uint32_t bits_of(float w) {
    uint32_t b;
    memcpy(&b, &w, 4);
    return b; /* for w >= 0 the bits order as the values do */
}

/* The highest of x[0:n]; *bad = 1 if any is NaN. */
float hk_max_checked(const float *x, int64_t n, int *bad) {
    const float ninf = -INFINITY;
    hk_v4 m0 = {ninf, ninf, ninf, ninf}, m1 = m0;
    hk_i4 nan = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        hk_v4 a, b;
        memcpy(&a, x + i, 16), memcpy(&b, x + i + 4, 16);
        nan |= (a != a) | (b != b);
        hk_i4 ga = a > m0, gb = b > m1;
        m0 = (hk_v4)((ga & (hk_i4)a) | (~ga & (hk_i4)m0));
        m1 = (hk_v4)((gb & (hk_i4)b) | (~gb & (hk_i4)m1));
    }
    int any = (nan[0] | nan[1] | nan[2] | nan[3]) != 0;
    float m = ninf;
    for (int j = 0; j < 4; j++) {
        if (m0[j] > m) m = m0[j];
        if (m1[j] > m) m = m1[j];
    }
    for (; i < n; i++) {
        if (x[i] != x[i]) any = 1;
        else if (x[i] > m) m = x[i];
    }
    *bad = any;
    return m;
}

/* Weights in w[0:n] below HK_TINY set to 0 (the vector exp floors at about 2^-126 instead of reaching 0);
   returns the sum of w in double. */
static double flush_and_sum(float *w, int64_t n) {
    const hk_v4 tiny = {HK_TINY, HK_TINY, HK_TINY, HK_TINY};
    hk_d2 a = {0, 0}, b = a, c = a, e = a; /* four chains of two lanes: all in registers */
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        hk_v4 x, y;
        memcpy(&x, w + i, 16), memcpy(&y, w + i + 4, 16);
        x = (hk_v4)((hk_i4)x & (x >= tiny));
        y = (hk_v4)((hk_i4)y & (y >= tiny));
        memcpy(w + i, &x, 16), memcpy(w + i + 4, &y, 16);
        a += (hk_d2){x[0], x[1]}, b += (hk_d2){x[2], x[3]};
        c += (hk_d2){y[0], y[1]}, e += (hk_d2){y[2], y[3]};
    }
    a = (a + b) + (c + e);
    double s = a[0] + a[1];
    for (; i < n; i++) {
        if (!(w[i] >= HK_TINY)) w[i] = 0.0f;
        s += w[i];
    }
    return s;
}

/* w = exp(z - m) over [0, n) in the vector exp of the decoder, flushed as above; returns the sum. In chunks
   that stay in L1 between the copy, the exp and the sum. */
static double exp_weights(const hk_vecops *vo, const float *z, float *w, int64_t n, float m) {
    double total = 0.0;
    for (int64_t i = 0; i < n; i += 2048) {
        const int64_t len = n - i < 2048 ? n - i : 2048;
        memcpy(w + i, z + i, sizeof(float) * (size_t)len);
        vo->exp_sum(w + i, (int)len, m);
        total += flush_and_sum(w + i, len);
    }
    return total;
}

/* Whether any of p[0:16] lies in [lo, hi). */
static inline int any_in16(const float *p, float lo, float hi) {
    const hk_v4 l = {lo, lo, lo, lo}, h = {hi, hi, hi, hi};
    hk_v4 a, b, c, d;
    memcpy(&a, p, 16), memcpy(&b, p + 4, 16), memcpy(&c, p + 8, 16), memcpy(&d, p + 12, 16);
    const hk_i4 in = ((a >= l) & (a < h)) | ((b >= l) & (b < h)) | ((c >= l) & (c < h)) | ((d >= l) & (d < h));
    return (in[0] | in[1] | in[2] | in[3]) != 0;
}

/* The nucleus: keep w_i > w, and w_i == w for ids up to last (ties keep their lowest ids). */
typedef struct {
    float w;
    int64_t last;
} hk_nucleus;

/* Walks buckets top..0 (the heavier weights first) adding their mass to *cum, stopping at the one where the
   cumulative share reaches p, or else at the last non-empty one; returns it, with *cum the mass before it. */
static int walk_buckets(const double *mass, const int64_t *count, int top, double *cum, double total, double p) {
    double c = *cum, before = c;
    int last = -1;
    for (int k = top; k >= 0; k--) {
        if (!count[k]) continue;
        before = c;
        c += mass[k];
        last = k;
        if (c / total >= p) break;
    }
    *cum = before;
    return last;
}

/* The smallest set of the heaviest weights (ties: lower ids first) holding at least p of total, as a sort by
   weight then a running sum would find it: a radix select on the weights' bits, 10 bits a level, collecting
   only the ids in the bucket where the running sum crosses p. Weights under t cannot be in it (all of them
   together hold less than 1 - p of the total) and are skipped. cand and group hold n ids each. */
static hk_nucleus nucleus(const float *w, int64_t n, double total, double p, int32_t *cand, int32_t *group) {
    static const int SHIFT[3] = {20, 10, 0};
    if (n <= 4096) { /* top-k's candidates: weights already heaviest first (ties in id order) need no select */
        int64_t i = 1;
        while (i < n && w[i - 1] >= w[i]) i++;
        if (i >= n) {
            hk_nucleus found = {0.0f, -1};
            double run = 0.0;
            for (int64_t j = 0; j < n && w[j] > 0.0f; j++) {
                run += w[j];
                found = (hk_nucleus){w[j], j};
                if (run / total >= p) break;
            }
            return found;
        }
    }
    double mass[1024], mass2[1024];
    int64_t count[1024], start[1025];
    float t = (float)(0.5 * (1.0 - p) * total / (double)n);
    if (!(t >= HK_TINY)) t = HK_TINY;
    double cum = 0.0;
    int64_t nc = 0;
    uint32_t prefix = 0;
    for (int level = 0; level < 3; level++) {
        const int sh = SHIFT[level];
        memset(mass, 0, sizeof mass), memset(mass2, 0, sizeof mass2), memset(count, 0, sizeof count);
        if (level == 0) {
            for (int64_t i = 0; i < n; i += 16) {
                /* most of a real model's vocabulary is far below t: 16 ruled out at once */
                if (i + 16 <= n && !any_in16(w + i, t, INFINITY)) continue;
                for (int64_t j = i; j < i + 16 && j < n; j++) { /* two histograms: half the chains through memory */
                    if (w[j] >= t) {
                        uint32_t k = bits_of(w[j]) >> 20;
                        (j & 1 ? mass2 : mass)[k] += w[j], count[k]++;
                    }
                }
            }
            for (int k = 0; k < 1024; k++) mass[k] += mass2[k];
        } else {
            for (int64_t j = 0; j < nc; j++) {
                uint32_t k = (bits_of(w[cand[j]]) >> sh) & 1023;
                mass[k] += w[cand[j]], count[k]++;
            }
        }
        if (level == 2) break;
        int k = walk_buckets(mass, count, level ? 1023 : (int)(bits_of(1.0f) >> 20), &cum, total, p);
        prefix |= (uint32_t)k << sh;
        const uint32_t high = 0xFFFFFFFFu << sh;
        if (level == 0) { /* the bucket's weights are the values in [lo, hi) */
            const uint32_t hi_bits = prefix + (1u << 20);
            float lo, hi;
            memcpy(&lo, &prefix, 4), memcpy(&hi, &hi_bits, 4);
            if (lo < t) lo = t;
            for (int64_t i = 0; i < n; i += 16) {
                if (i + 16 <= n && !any_in16(w + i, lo, hi)) continue;
                for (int64_t j = i; j < i + 16 && j < n; j++) { /* no branch: flat logits mix members and not */
                    cand[nc] = (int32_t)j;
                    nc += w[j] >= lo && w[j] < hi;
                }
            }
        } else {
            int64_t kept = 0;
            for (int64_t j = 0; j < nc; j++)
                if ((bits_of(w[cand[j]]) & high) == prefix) cand[kept++] = cand[j];
            nc = kept;
        }
    }
    /* the last level's buckets are single values: groups of equal weights, each walked in id order */
    start[0] = 0;
    for (int k = 0; k < 1024; k++) start[k + 1] = start[k] + count[k];
    for (int64_t j = 0; j < nc; j++) group[start[bits_of(w[cand[j]]) & 1023]++] = cand[j];
    hk_nucleus found = {0.0f, -1};
    int64_t end = nc;
    for (int k = 1023; k >= 0; k--) {
        const int64_t begin = end - count[k];
        for (int64_t j = begin; j < end; j++) {
            const float v = w[group[j]];
            cum += v;
            found = (hk_nucleus){v, group[j]};
            if (cum / total >= p) return found;
        }
        end = begin;
    }
    return found; /* the running sum fell short of p by rounding: everything collected is kept */
}


/* For ids base .. base + n - 1: w[i] = what the draw exponentiates for id base + i: z_i / temp where
   z_i >= thr and (nucleus_on) the id is in the nucleus, else -inf; with reuse (temp 1 after a nucleus), w_i
   itself where kept, else 0. Returns how many were kept. */
static int64_t keep_survivors(const float *z, float *w, int64_t n, int64_t base, float thr, int nucleus_on,
                              hk_nucleus ns, float temp, int reuse) {
    const float drop = reuse ? 0.0f : -INFINITY;
    const int32_t last = (int32_t)(ns.last < INT32_MAX ? ns.last : INT32_MAX);
    const hk_v4 thr4 = {thr, thr, thr, thr}, ws = {ns.w, ns.w, ns.w, ns.w}, t4 = {temp, temp, temp, temp},
                drop4 = {drop, drop, drop, drop};
    const int32_t b0 = (int32_t)base;
    const hk_i4 last4 = {last, last, last, last}, four = {4, 4, 4, 4};
    hk_i4 id = {b0, b0 + 1, b0 + 2, b0 + 3}, kept = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4, id += four) {
        hk_v4 zv, wv;
        memcpy(&zv, z + i, 16), memcpy(&wv, w + i, 16);
        hk_i4 keep = zv >= thr4;
        if (nucleus_on) keep &= (wv > ws) | ((wv == ws) & (id <= last4));
        const hk_v4 v = reuse ? wv : zv / t4; /* the same IEEE division as NumPy's, four at a time */
        const hk_v4 out = (hk_v4)((keep & (hk_i4)v) | (~keep & (hk_i4)drop4));
        memcpy(w + i, &out, 16);
        kept -= keep; /* true lanes are -1 */
    }
    int64_t count = (int64_t)kept[0] + kept[1] + kept[2] + kept[3];
    for (; i < n; i++) {
        const int keep = z[i] >= thr && (!nucleus_on || w[i] > ns.w || (w[i] == ns.w && base + i <= ns.last));
        w[i] = keep ? (reuse ? w[i] : z[i] / temp) : drop;
        count += keep;
    }
    return count;
}

/* The draw (see sampling_draw.h); returns the index, or -1 when nothing finite is left to draw from. */
int64_t hk_draw(const hk_draw_work *d, double top_p, double min_p, double temperature, double u,
                double *logprob) {
    const int64_t n = d->n;
    const float *z = d->z;
    float *w = d->w;
    int bad;
    float top = hk_max_checked(z, n, &bad);
    if (bad || !isfinite(top)) return -1;
    const hk_vecops *vo = hk_vecops_active();
    const int nucleus_on = top_p < 1.0;
    hk_nucleus ns = {0.0f, n};
    const float best = top;
    if (nucleus_on) {
        ns = nucleus(w, n, exp_weights(vo, z, w, n, top), top_p, d->cand, d->group);
        if (ns.w == 1.0f) { /* the best logit may have lost a tie at weight 1 to a lower id: the kept maximum */
            top = -INFINITY;
            for (int64_t i = 0; i <= ns.last; i++)
                if (w[i] == 1.0f && z[i] > top) top = z[i];
        }
    }
    const float temp = (float)temperature, thr = min_p > 0.0 ? top + (float)log(min_p) : -INFINITY;
    const float shift = top / temp; /* the highest tempered logit left */
    if (!isfinite(shift)) return -1;
    /* z / 1 = z and the same maximum: the nucleus's weights are the draw's */
    const int reuse = nucleus_on && temp == 1.0f && top == best;
    const int64_t nb = (n + HK_BLOCK - 1) / HK_BLOCK;
    double run = 0.0;
    for (int64_t b = 0; b < nb; b++) { /* a block with nothing kept weighs 0 and is never searched: skipped */
        const int64_t lo = b * HK_BLOCK, len = n - lo < HK_BLOCK ? n - lo : HK_BLOCK;
        if (keep_survivors(z + lo, w + lo, len, lo, thr, nucleus_on, ns, temp, reuse)) {
            if (!reuse) vo->exp_sum(w + lo, (int)len, shift);
            run += flush_and_sum(w + lo, len);
        }
        d->cdf[b] = run;
    }
    const double total = run;
    double point = u * total;
    if (point >= total) point = nextafter(total, 0.0); /* u * total can round up to total itself */
    int64_t b = 0;
    while (b < nb - 1 && !(d->cdf[b] > point)) b++;
    const int64_t lo = b * HK_BLOCK, len = n - lo < HK_BLOCK ? n - lo : HK_BLOCK;
    const double target = point - (b ? d->cdf[b - 1] : 0.0);
    double inside = 0.0;
    int64_t pick = -1;
    for (int64_t j = 0; j < len && pick < 0; j++) {
        inside += w[lo + j];
        if (inside > target) pick = lo + j;
    }
    for (int64_t j = len - 1; pick < 0 && j >= 0; j--) /* rounding put the point at the block's end */
        if (w[lo + j] != 0.0f) pick = lo + j;
    *logprob = log((double)w[pick]) - log(total);
    return pick;
}
