/* The sampler's top-k over a whole vocabulary in one pass: NumPy's argpartition over 150k-260k logits was most of
   a chat-default sampling step. The k best (logit, id) pairs, best first, where a higher logit is better and
   among equal logits the lower id: the same set and order as the NumPy fallback in vector_math.py. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sampling.h"

typedef float hk_v4 __attribute__((vector_size(16))); /* GCC/Clang vectors: SSE2 or NEON, no ISA dispatch */
typedef int32_t hk_i4 __attribute__((vector_size(16)));

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
    if (PyArray_DIM(va, 0) != m) return PyErr_Format(PyExc_ValueError, "ids and values differ in length");
    const float *x = PyArray_DATA(la), *vals = PyArray_DATA(va);
    const int64_t *ids = PyArray_DATA(ia);
    hk_scored *over = PyMem_Malloc(sizeof(hk_scored) * (size_t)(m ? m : 1));
    hk_scored *heap = PyMem_Malloc(sizeof(hk_scored) * (size_t)k);
    if (!over || !heap) {
        PyMem_Free(over);
        PyMem_Free(heap);
        return PyErr_NoMemory();
    }
    for (int64_t j = 0; j < m; j++) over[j] = (hk_scored){vals[j], ids[j]};
    qsort(over, (size_t)m, sizeof(hk_scored), cmp_id);
    for (int64_t j = 0; j < m; j++) {
        if (over[j].id < 0 || over[j].id >= n || (j && over[j].id == over[j - 1].id)) {
            PyMem_Free(over);
            PyMem_Free(heap);
            return PyErr_Format(PyExc_ValueError, "replaced ids must be distinct and in [0, %lld)", (long long)n);
        }
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

static PyMethodDef METHODS[] = {
    {"top_k_sorted", py_top_k_sorted, METH_VARARGS, "top_k_sorted(logits, k, ids, values)"},
    {NULL, NULL, 0, NULL},
};

int hk_sampling_add_functions(PyObject *module) {
    if (_import_array() < 0) return -1; /* this file's own copy of NumPy's C API table */
    return PyModule_AddFunctions(module, METHODS);
}
