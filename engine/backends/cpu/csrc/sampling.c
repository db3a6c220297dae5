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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sampling.h"
#include "sampling_draw.h"


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

/* heap[0:k]: the k best of x[0:n] with the m pairs over (sorted by id, distinct) in place of those ids, best
   first: the stretches between replaced ids are scanned, then the replaced ones offered. */
static void select_top_k(hk_scored *heap, int64_t k, const float *x, int64_t n, const hk_scored *over, int64_t m) {
    hk_top t = {heap, k, 0};
    int64_t begin = 0;
    for (int64_t j = 0; j < m; j++) {
        scan(&t, x, begin, over[j].id);
        begin = over[j].id + 1;
    }
    scan(&t, x, begin, n);
    for (int64_t j = 0; j < m; j++) offer(&t, over[j]);
    qsort(heap, (size_t)k, sizeof(hk_scored), cmp_best_first);
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
    Py_BEGIN_ALLOW_THREADS
    select_top_k(heap, k, x, n, over, m);
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
    char *scratch = hk_thread_scratch(sizeof(float) * (size_t)n * (m ? 2 : 1) + sizeof(double) * (size_t)nb +
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
    id = hk_draw(&d, top_p, min_p, temperature, u, &logprob);
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
    if (PySequence_Fast_GET_SIZE(fast) < m) { /* a sequence whose length changed under us (not a list or tuple) */
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "recent ids must be a sequence of integers");
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
    char *scratch = hk_thread_scratch(sizeof(hk_scored) * (size_t)(k + m) + sizeof(int64_t) * (size_t)m +
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
    const float top = hk_max_checked(x, n, &bad);
    if (!bad && isfinite(top)) {
        const int64_t distinct = m ? penalise(x, recent, m, rp, pp, fp, over) : 0;
        select_top_k(heap, k, x, n, over, distinct);
        for (int64_t j = 0; j < k; j++) z[j] = heap[j].v;
        const int64_t pick = hk_draw(&d, top_p, min_p, temperature, u, &logprob);
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
