/* The sampler's arithmetic over a whole vocabulary (150k-260k logits), where NumPy took milliseconds a token.

   top_k_sorted: the k best (logit, id) pairs in one pass, best first, where a higher logit is better and among
   equal logits the lower id: the same set and order as the NumPy fallback in vector_math.py.
   sample_vocabulary: with top-k off, top-p, min-p, temperature and the inverse-CDF draw over every id in a few
   passes: the nucleus by a three-level radix select on the weights' bits instead of a sort.
   sample_top_k: a whole sampler step with top-k on (penalties, top-k, then sample_vocabulary's steps on the k
   candidates) in one call. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sampling.h"
#include "vecops.h"

typedef float hk_v4 __attribute__((vector_size(16))); /* GCC/Clang vectors: SSE2 or NEON, no ISA dispatch */
typedef int32_t hk_i4 __attribute__((vector_size(16)));
typedef double hk_d2 __attribute__((vector_size(16)));

typedef struct {
    float v;
    int64_t id;
} hk_scored;

/* a ranks before b: a higher score, or the same score and a lower id */
static inline int hk_better(hk_scored a, hk_scored b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

/* A min-heap of the k best so far: heap[0] is the worst of them, the one a better candidate replaces. */
static void sift_down(hk_scored *heap, int64_t n, int64_t i) {
    hk_scored item = heap[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && hk_better(heap[c], heap[c + 1])) c++;
        if (!hk_better(item, heap[c])) break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = item;
}

static void sift_up(hk_scored *heap, int64_t i) {
    hk_scored item = heap[i];
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!hk_better(heap[p], item)) break;
        heap[i] = heap[p];
        i = p;
    }
    heap[i] = item;
}

typedef struct {
    hk_scored *heap;
    int64_t k, n;
} hk_top;

static void offer(hk_top *t, hk_scored c) {
    if (t->n < t->k) {
        t->heap[t->n] = c;
        sift_up(t->heap, t->n++);
    } else if (hk_better(c, t->heap[0])) {
        t->heap[0] = c;
        sift_down(t->heap, t->k, 0);
    }
}

/* Offer x[begin:end] in ascending id order. Everything already held has a lower id, so an equal score never
   wins: only x > the worst held score is a candidate, which a block of 16 rules out with one vector compare. */
static void scan(hk_top *t, const float *x, int64_t begin, int64_t end) {
    int64_t i = begin;
    while (i < end && t->n < t->k) {
        offer(t, (hk_scored){x[i], i});
        i++;
    }
    float worst = t->n ? t->heap[0].v : 0.0f;
    for (; i + 16 <= end; i += 16) {
        hk_v4 a, b, c, d, w = {worst, worst, worst, worst};
        memcpy(&a, x + i, 16), memcpy(&b, x + i + 4, 16), memcpy(&c, x + i + 8, 16), memcpy(&d, x + i + 12, 16);
        hk_i4 over = (a > w) | (b > w) | (c > w) | (d > w);
        if (!(over[0] | over[1] | over[2] | over[3])) continue;
        for (int j = 0; j < 16; j++) {
            if (x[i + j] > worst) {
                t->heap[0] = (hk_scored){x[i + j], i + j};
                sift_down(t->heap, t->k, 0);
                worst = t->heap[0].v;
            }
        }
    }
    for (; i < end; i++) {
        if (x[i] > worst) {
            t->heap[0] = (hk_scored){x[i], i};
            sift_down(t->heap, t->k, 0);
            worst = t->heap[0].v;
        }
    }
}

static int cmp_best_first(const void *a, const void *b) {
    hk_scored x = *(const hk_scored *)a, y = *(const hk_scored *)b;
    return hk_better(x, y) ? -1 : (hk_better(y, x) ? 1 : 0);
}

static int cmp_id(const void *a, const void *b) {
    int64_t x = ((const hk_scored *)a)->id, y = ((const hk_scored *)b)->id;
    return (x > y) - (x < y);
}

static PyArrayObject *as_1d(PyObject *obj, int type, const char *what) {
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != type || PyArray_NDIM((PyArrayObject *)obj) != 1 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj)) {
        PyErr_Format(PyExc_ValueError, "%s must be a contiguous 1-D %s array", what,
                     type == NPY_FLOAT32 ? "float32" : "int64");
        return NULL;
    }
    return (PyArrayObject *)obj;
}

/* The replaced logits (ids, values) as pairs sorted by id, or NULL with an exception: ids must be distinct and in
   [0, n). The caller frees the result with PyMem_Free. */
static hk_scored *read_overrides(PyArrayObject *ia, PyArrayObject *va, int64_t n) {
    const int64_t m = PyArray_DIM(ia, 0);
    if (PyArray_DIM(va, 0) != m) {
        PyErr_Format(PyExc_ValueError, "ids and values differ in length");
        return NULL;
    }
    const float *vals = PyArray_DATA(va);
    const int64_t *ids = PyArray_DATA(ia);
    hk_scored *over = PyMem_Malloc(sizeof(hk_scored) * (size_t)(m ? m : 1));
    if (!over) return (hk_scored *)PyErr_NoMemory();
    for (int64_t j = 0; j < m; j++) over[j] = (hk_scored){vals[j], ids[j]};
    qsort(over, (size_t)m, sizeof(hk_scored), cmp_id);
    for (int64_t j = 0; j < m; j++) {
        if (over[j].id < 0 || over[j].id >= n || (j && over[j].id == over[j - 1].id)) {
            PyMem_Free(over);
            PyErr_Format(PyExc_ValueError, "replaced ids must be distinct and in [0, %lld)", (long long)n);
            return NULL;
        }
    }
    return over;
}

/* top_k_sorted(logits, k, ids, values) -> (ids int64 (k,), scores float32 (k,)), best first. ``ids``/``values``
   replace those logits (the penalised ones) without a copy of the vocabulary; ids must be distinct. */
static PyObject *py_top_k_sorted(PyObject *self, PyObject *args) {
    PyObject *lo, *io, *vo;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OnOO", &lo, &k, &io, &vo)) return NULL;
    PyArrayObject *la = as_1d(lo, NPY_FLOAT32, "logits"), *ia = as_1d(io, NPY_INT64, "ids"),
                  *va = as_1d(vo, NPY_FLOAT32, "values");
    if (!la || !ia || !va) return NULL;
    const int64_t n = PyArray_DIM(la, 0), m = PyArray_DIM(ia, 0);
    if (k < 1 || k > n) return PyErr_Format(PyExc_ValueError, "k must be in [1, %lld], got %zd", (long long)n, k);
    const float *x = PyArray_DATA(la);
    hk_scored *over = read_overrides(ia, va, n);
    if (!over) return NULL;
    hk_scored *heap = PyMem_Malloc(sizeof(hk_scored) * (size_t)k);
    if (!heap) {
        PyMem_Free(over);
        return PyErr_NoMemory();
    }
    hk_top t = {heap, k, 0};
    Py_BEGIN_ALLOW_THREADS
    int64_t begin = 0;
    for (int64_t j = 0; j < m; j++) { /* the stretches between replaced ids, then the replaced ones */
        scan(&t, x, begin, over[j].id);
        begin = over[j].id + 1;
    }
    scan(&t, x, begin, n);
    for (int64_t j = 0; j < m; j++) offer(&t, over[j]);
    qsort(heap, (size_t)k, sizeof(hk_scored), cmp_best_first);
    Py_END_ALLOW_THREADS
    PyMem_Free(over);
    npy_intp dims[1] = {(npy_intp)k};
    PyArrayObject *out_ids = (PyArrayObject *)PyArray_SimpleNew(1, dims, NPY_INT64);
    PyArrayObject *out_v = (PyArrayObject *)PyArray_SimpleNew(1, dims, NPY_FLOAT32);
    if (!out_ids || !out_v) {
        Py_XDECREF(out_ids);
        Py_XDECREF(out_v);
        PyMem_Free(heap);
        return NULL;
    }
    int64_t *oi = PyArray_DATA(out_ids);
    float *ov = PyArray_DATA(out_v);
    for (int64_t j = 0; j < k; j++) {
        oi[j] = heap[j].id;
        ov[j] = heap[j].v;
    }
    PyMem_Free(heap);
    return Py_BuildValue("(NN)", out_ids, out_v);
}

/* -- sample_vocabulary: top-p, min-p, temperature and the draw over every id ------------------------------------ */

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

static char *thread_scratch(size_t size) {
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
#define HK_BLOCK 512      /* the draw's ids per block: block sums first, then a running sum inside one block */

static inline uint32_t bits_of(float w) {
    uint32_t b;
    memcpy(&b, &w, 4);
    return b; /* for w >= 0 the bits order as the values do */
}

/* The highest of x[0:n]; *bad = 1 if any is NaN. */
static float max_checked(const float *x, int64_t n, int *bad) {
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

typedef struct {
    const float *z;  /* (n,) the logits with the penalised ones replaced */
    float *w;        /* (n,) scratch: the weights */
    double *cdf;     /* (n / HK_BLOCK + 1,) the running sums of the draw's block weights */
    int32_t *cand;   /* (n,) */
    int32_t *group;  /* (n,) */
    int64_t n;
} hk_draw_work;

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

/* The draw (see py_sample_vocabulary); returns the id, or -1 when nothing finite is left to draw from. */
static int64_t draw(const hk_draw_work *d, double top_p, double min_p, double temperature, double u,
                    double *logprob) {
    const int64_t n = d->n;
    const float *z = d->z;
    float *w = d->w;
    int bad;
    float top = max_checked(z, n, &bad);
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

/* sample_vocabulary(logits, ids, values, top_p, min_p, temperature, u) -> (id, logprob): top-p (< 1), min-p
   (> 0), temperature (> 0) and the inverse-CDF draw at u in [0, 1) over every id, the penalised logits given
   as (ids, values) beside the model's. id -1 (logprob NaN): NaN or +inf among the logits, or nothing finite. */
static PyObject *py_sample_vocabulary(PyObject *self, PyObject *args) {
    PyObject *lo, *io, *vo;
    double top_p, min_p, temperature, u;
    if (!PyArg_ParseTuple(args, "OOOdddd", &lo, &io, &vo, &top_p, &min_p, &temperature, &u)) return NULL;
    PyArrayObject *la = as_1d(lo, NPY_FLOAT32, "logits"), *ia = as_1d(io, NPY_INT64, "ids"),
                  *va = as_1d(vo, NPY_FLOAT32, "values");
    if (!la || !ia || !va) return NULL;
    const int64_t n = PyArray_DIM(la, 0), m = PyArray_DIM(ia, 0);
    if (n < 1 || n > INT32_MAX) return PyErr_Format(PyExc_ValueError, "logits must hold 1 to 2^31 - 1 values");
    if (!(top_p >= 0.0 && top_p <= 1.0) || !(min_p >= 0.0 && min_p <= 1.0) || !(temperature > 0.0) ||
        !isfinite(temperature) || !(u >= 0.0 && u < 1.0))
        return PyErr_Format(PyExc_ValueError, "need 0 <= top_p, min_p <= 1, a finite temperature > 0, 0 <= u < 1");
    hk_scored *over = read_overrides(ia, va, n);
    if (!over) return NULL;
    const int64_t nb = (n + HK_BLOCK - 1) / HK_BLOCK;
    char *scratch = thread_scratch(sizeof(float) * (size_t)n * (m ? 2 : 1) + sizeof(double) * (size_t)nb +
                                   sizeof(int32_t) * 2 * (size_t)n);
    if (!scratch) {
        PyMem_Free(over);
        return PyErr_NoMemory();
    }
    hk_draw_work d = {PyArray_DATA(la), NULL, (double *)scratch, NULL, NULL, n};
    d.w = (float *)(d.cdf + nb);
    d.cand = (int32_t *)(d.w + n);
    d.group = d.cand + n;
    int64_t id;
    double logprob = NAN;
    Py_BEGIN_ALLOW_THREADS
    if (m) { /* the model's logits with the penalised ones replaced */
        float *z = (float *)(d.group + n);
        memcpy(z, d.z, sizeof(float) * (size_t)n);
        for (int64_t j = 0; j < m; j++) z[over[j].id] = over[j].v;
        d.z = z;
    }
    id = draw(&d, top_p, min_p, temperature, u, &logprob);
    Py_END_ALLOW_THREADS
    PyMem_Free(over);
    return Py_BuildValue("(Ld)", (long long)id, logprob);
}

/* -- sample_top_k: penalties, top-k, then top-p, min-p, temperature and the draw on the k candidates ---------- */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The recent ids of sequence ro, sorted, into ids (room for m); 0, or -1 with an exception. */
static int read_recent(PyObject *ro, int64_t *ids, int64_t m) {
    PyObject *fast = PySequence_Fast(ro, "recent ids must be a sequence of integers");
    if (!fast) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != m) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "recent ids changed length");
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (int64_t j = 0; j < m; j++) {
        ids[j] = PyLong_AsLongLong(items[j]);
        if (ids[j] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    qsort(ids, (size_t)m, sizeof(int64_t), cmp_i64);
    return 0;
}

/* The penalised logits of the distinct ids in sorted[0:m] (llama.cpp's rules, as penalty_changes in
   vector_math.py: a seen token's positive logit divided by the repeat penalty, a negative one multiplied, in
   float32; then count * frequency + presence subtracted in double), into over, sorted by id; returns how many. */
static int64_t penalise(const float *x, const int64_t *sorted, int64_t m, double rp, double pp, double fp,
                        hk_scored *over) {
    int64_t distinct = 0;
    for (int64_t j = 0; j < m;) {
        int64_t end = j;
        while (end < m && sorted[end] == sorted[j]) end++;
        float v = x[sorted[j]];
        if (rp != 1.0) v = v > 0 ? v / (float)rp : v * (float)rp;
        if (pp != 0.0 || fp != 0.0) v = (float)((double)v - ((double)(end - j) * fp + pp));
        over[distinct++] = (hk_scored){v, sorted[j]};
        j = end;
    }
    return distinct;
}

/* sample_top_k(logits, k, recent, repeat_penalty, presence_penalty, frequency_penalty, top_p, min_p,
   temperature, u) -> (id, logprob): a whole sampler step in one call where it took a dozen NumPy steps (each
   cold after a decode step): the penalties on the ids of sequence ``recent``, the k best logits (ties: lower
   ids), then sample_vocabulary's top-p, min-p, temperature and draw on those k, best first. id -1 (logprob
   NaN): NaN or +inf among the logits, or nothing finite left. */
static PyObject *py_sample_top_k(PyObject *self, PyObject *args) {
    PyObject *lo, *ro;
    Py_ssize_t k;
    double rp, pp, fp, top_p, min_p, temperature, u;
    if (!PyArg_ParseTuple(args, "OnOddddddd", &lo, &k, &ro, &rp, &pp, &fp, &top_p, &min_p, &temperature, &u))
        return NULL;
    PyArrayObject *la = as_1d(lo, NPY_FLOAT32, "logits");
    if (!la) return NULL;
    const int64_t n = PyArray_DIM(la, 0);
    if (k < 1 || k > n) return PyErr_Format(PyExc_ValueError, "k must be in [1, %lld], got %zd", (long long)n, k);
    if (!(top_p >= 0.0 && top_p <= 1.0) || !(min_p >= 0.0 && min_p <= 1.0) || !(temperature > 0.0) ||
        !isfinite(temperature) || !(u >= 0.0 && u < 1.0) || !(rp > 0.0) || !isfinite(rp) || !isfinite(pp) ||
        !isfinite(fp))
        return PyErr_Format(PyExc_ValueError, "need 0 <= top_p, min_p <= 1, a finite temperature > 0, 0 <= u < 1, "
                            "a finite repeat penalty > 0 and finite presence and frequency penalties");
    const Py_ssize_t m_all = PySequence_Size(ro);
    if (m_all < 0) return NULL;
    const int64_t m = (rp != 1.0 || pp != 0.0 || fp != 0.0) ? (int64_t)m_all : 0; /* no penalty: nothing read */
    const int64_t nb = (k + HK_BLOCK - 1) / HK_BLOCK;
    char *scratch = thread_scratch(sizeof(hk_scored) * (size_t)(k + m) + sizeof(int64_t) * (size_t)m +
                                   sizeof(double) * (size_t)nb + sizeof(float) * 2 * (size_t)k +
                                   sizeof(int32_t) * 2 * (size_t)k);
    if (!scratch) return PyErr_NoMemory();
    hk_scored *heap = (hk_scored *)scratch, *over = heap + k;
    int64_t *recent = (int64_t *)(over + m);
    hk_draw_work d = {NULL, NULL, (double *)(recent + m), NULL, NULL, k};
    float *z = (float *)(d.cdf + nb);
    d.z = z, d.w = z + k;
    d.cand = (int32_t *)(d.w + k);
    d.group = d.cand + k;
    if (m && read_recent(ro, recent, m) < 0) return NULL;
    if (m && (recent[0] < 0 || recent[m - 1] >= n))
        return PyErr_Format(PyExc_ValueError, "token id %lld in the history is outside the vocabulary of %lld",
                            (long long)(recent[0] < 0 ? recent[0] : recent[m - 1]), (long long)n);
    const float *x = PyArray_DATA(la);
    int64_t id = -1;
    double logprob = NAN;
    Py_BEGIN_ALLOW_THREADS
    int bad;
    const float top = max_checked(x, n, &bad);
    if (!bad && isfinite(top)) {
        const int64_t distinct = m ? penalise(x, recent, m, rp, pp, fp, over) : 0;
        hk_top t = {heap, k, 0};
        int64_t begin = 0;
        for (int64_t j = 0; j < distinct; j++) { /* as top_k_sorted: the stretches between, then the penalised */
            scan(&t, x, begin, over[j].id);
            begin = over[j].id + 1;
        }
        scan(&t, x, begin, n);
        for (int64_t j = 0; j < distinct; j++) offer(&t, over[j]);
        qsort(heap, (size_t)k, sizeof(hk_scored), cmp_best_first);
        for (int64_t j = 0; j < k; j++) z[j] = heap[j].v;
        const int64_t pick = draw(&d, top_p, min_p, temperature, u, &logprob);
        if (pick >= 0) id = heap[pick].id;
    }
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(Ld)", (long long)id, logprob);
}

static PyMethodDef METHODS[] = {
    {"sample_top_k", py_sample_top_k, METH_VARARGS,
     "sample_top_k(logits, k, recent, repeat_penalty, presence_penalty, frequency_penalty, top_p, min_p, "
     "temperature, u)"},
    {"top_k_sorted", py_top_k_sorted, METH_VARARGS, "top_k_sorted(logits, k, ids, values)"},
    {"sample_vocabulary", py_sample_vocabulary, METH_VARARGS,
     "sample_vocabulary(logits, ids, values, top_p, min_p, temperature, u)"},
    {NULL, NULL, 0, NULL},
};

int hk_sampling_add_functions(PyObject *module) {
    if (_import_array() < 0) return -1; /* this file's own copy of NumPy's C API table */
    return PyModule_AddFunctions(module, METHODS);
}
