/* The Python module engine.backends.cpu._kernels: argument checks, GIL release, and one lock around the
   pool and scratch buffer so concurrent callers queue instead of racing. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <pthread.h>

#include "decoder_module.h"
#include "matmul.h"
#include "pool.h"
#include "sampling.h"
#include "vecops.h"

pthread_mutex_t hk_compute = PTHREAD_MUTEX_INITIALIZER; /* shared with the decoder's functions */
#define COMPUTE hk_compute

/* The packed weights: a 2-D uint8 array whose rows are whole blocks of qtype, bytes contiguous in a row. */
static const hk_type *check_weights(PyObject *obj, int qtype, int *rows, int *cols) {
    const hk_type *ti = hk_type_info(qtype);
    if (!ti) {
        PyErr_Format(PyExc_ValueError, "GGML type %d is not supported by the CPU kernels", qtype);
        return NULL;
    }
    if (!PyArray_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "w must be a numpy array of packed blocks");
        return NULL;
    }
    PyArrayObject *w = (PyArrayObject *)obj;
    if (PyArray_TYPE(w) != NPY_UINT8 || PyArray_NDIM(w) != 2 || (PyArray_DIM(w, 1) > 1 && PyArray_STRIDE(w, 1) != 1)) {
        PyErr_SetString(PyExc_ValueError, "w must be a uint8 array (rows, row_bytes) with contiguous bytes in each row");
        return NULL;
    }
    npy_intp nrows = PyArray_DIM(w, 0), row_bytes = PyArray_DIM(w, 1);
    if (row_bytes % ti->type_size != 0) {
        PyErr_Format(PyExc_ValueError, "a %s row must be whole %d-byte blocks, got %zd bytes", ti->name, ti->type_size, (Py_ssize_t)row_bytes);
        return NULL;
    }
    npy_intp ncols = row_bytes / ti->type_size * ti->block;
    if (hk_is_r16(qtype) && nrows % 16 != 0) {
        PyErr_Format(PyExc_ValueError, "a %s matrix is whole groups of 16 rows, got %zd rows", ti->name, (Py_ssize_t)nrows);
        return NULL;
    }
    if (nrows > INT_MAX || ncols > INT_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "w is too large for the CPU kernels");
        return NULL;
    }
    *rows = (int)nrows;
    *cols = (int)ncols;
    return ti;
}

static int is_f32_c(PyObject *obj, int writeable) {
    if (!PyArray_Check(obj)) return 0;
    PyArrayObject *a = (PyArrayObject *)obj;
    return PyArray_TYPE(a) == NPY_FLOAT32 && PyArray_NDIM(a) == 2 && PyArray_IS_C_CONTIGUOUS(a) && PyArray_ISALIGNED(a)
           && (!writeable || PyArray_ISWRITEABLE(a));
}

static PyObject *py_matmul(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"w", "qtype", "x", "out", NULL};
    PyObject *wobj, *xobj, *outobj = Py_None;
    int qtype, rows, cols;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OiO|O:matmul", names, &wobj, &qtype, &xobj, &outobj)) return NULL;
    const hk_type *ti = check_weights(wobj, qtype, &rows, &cols);
    if (!ti) return NULL;
    if (!is_f32_c(xobj, 0) || PyArray_DIM((PyArrayObject *)xobj, 1) != cols) {
        PyErr_Format(PyExc_ValueError, "x must be a C-contiguous float32 array (n, %d)", cols);
        return NULL;
    }
    PyArrayObject *x = (PyArrayObject *)xobj, *out;
    npy_intp n = PyArray_DIM(x, 0);
    if (n > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "too many tokens");
        return NULL;
    }
    if (outobj == Py_None) {
        npy_intp dims[2] = {n, rows};
        out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT32);
        if (!out) return NULL;
    } else {
        if (!is_f32_c(outobj, 1) || PyArray_DIM((PyArrayObject *)outobj, 0) != n || PyArray_DIM((PyArrayObject *)outobj, 1) != rows) {
            PyErr_Format(PyExc_ValueError, "out must be a writeable C-contiguous float32 array (%zd, %d)", (Py_ssize_t)n, rows);
            return NULL;
        }
        out = (PyArrayObject *)outobj;
        const char *o = PyArray_BYTES(out), *xb = PyArray_BYTES(x);
        if (o < xb + PyArray_NBYTES(x) && xb < o + PyArray_NBYTES(out)) { /* x is read while out is written */
            PyErr_SetString(PyExc_ValueError, "out must not share memory with x");
            return NULL;
        }
        Py_INCREF(out);
    }
    const uint8_t *w = (const uint8_t *)PyArray_BYTES((PyArrayObject *)wobj);
    ptrdiff_t w_stride = PyArray_STRIDE((PyArrayObject *)wobj, 0);
    const float *xp = (const float *)PyArray_DATA(x);
    float *op = (float *)PyArray_DATA(out);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&COMPUTE);
    rc = hk_matmul(qtype, w, w_stride, rows, cols, xp, (int)n, op);
    pthread_mutex_unlock(&COMPUTE);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    return (PyObject *)out;
}

static PyObject *py_get_rows(PyObject *self, PyObject *args) {
    PyObject *wobj, *idobj;
    int qtype, rows, cols;
    if (!PyArg_ParseTuple(args, "OiO:get_rows", &wobj, &qtype, &idobj)) return NULL;
    const hk_type *ti = check_weights(wobj, qtype, &rows, &cols);
    if (!ti) return NULL;
    PyArrayObject *ids = (PyArrayObject *)PyArray_FROMANY(idobj, NPY_INTP, 0, 1, NPY_ARRAY_IN_ARRAY);
    if (!ids) return NULL;
    npy_intp n = PyArray_SIZE(ids), dims[2] = {n, cols};
    const npy_intp *idp = (const npy_intp *)PyArray_DATA(ids);
    for (npy_intp i = 0; i < n; i++)
        if (idp[i] < 0 || idp[i] >= rows) {
            PyErr_Format(PyExc_IndexError, "row id %zd is out of range for %d rows", (Py_ssize_t)idp[i], rows);
            Py_DECREF(ids);
            return NULL;
        }
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    if (!out) {
        Py_DECREF(ids);
        return NULL;
    }
    const uint8_t *w = (const uint8_t *)PyArray_BYTES((PyArrayObject *)wobj);
    ptrdiff_t w_stride = PyArray_STRIDE((PyArrayObject *)wobj, 0);
    float *op = (float *)PyArray_DATA(out);
    Py_BEGIN_ALLOW_THREADS
    for (npy_intp i = 0; i < n; i++) hk_matrix_row(qtype, w, w_stride, idp[i], cols, op + i * cols);
    Py_END_ALLOW_THREADS
    Py_DECREF(ids);
    return (PyObject *)out;
}

/* repack16(w, qtype, out=None): w in the 16-row layout of the active ISA (into out, a C-contiguous uint8 array
   of w's shape, or a new one) and its type, or None where that ISA has no 16-row kernels for qtype or w's rows
   are not whole groups of 16. */
static PyObject *py_repack16(PyObject *self, PyObject *args) {
    PyObject *wobj, *outobj = Py_None;
    int qtype, rows, cols;
    if (!PyArg_ParseTuple(args, "Oi|O:repack16", &wobj, &qtype, &outobj)) return NULL;
    if (!check_weights(wobj, qtype, &rows, &cols)) return NULL;
    const int r16 = hk_repack_type(qtype);
    if (r16 < 0 || rows == 0 || rows % 16 != 0) Py_RETURN_NONE;
    PyArrayObject *w = (PyArrayObject *)wobj, *out;
    if (outobj == Py_None) {
        out = (PyArrayObject *)PyArray_SimpleNew(2, PyArray_DIMS(w), NPY_UINT8);
        if (!out) return NULL;
    } else {
        out = (PyArrayObject *)outobj;
        if (!PyArray_Check(outobj) || PyArray_TYPE(out) != NPY_UINT8 || !PyArray_IS_C_CONTIGUOUS(out) ||
            !PyArray_ISWRITEABLE(out) || PyArray_NDIM(out) != 2 || PyArray_DIM(out, 0) != rows ||
            PyArray_DIM(out, 1) != PyArray_DIM(w, 1)) {
            PyErr_SetString(PyExc_ValueError, "out must be a writeable C-contiguous uint8 array of w's shape");
            return NULL;
        }
        Py_INCREF(out);
    }
    const uint8_t *src = (const uint8_t *)PyArray_BYTES(w);
    const ptrdiff_t stride = PyArray_STRIDE(w, 0);
    uint8_t *dst = (uint8_t *)PyArray_DATA(out);
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&COMPUTE);
    hk_repack16(qtype, src, stride, rows, cols / hk_type_info(qtype)->block, dst);
    pthread_mutex_unlock(&COMPUTE);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("Ni", (PyObject *)out, r16);
}

/* repack_type(qtype): the 16-row type repack16 gives qtype under the active ISA, or -1. */
static PyObject *py_repack_type(PyObject *self, PyObject *arg) {
    long qtype = PyLong_AsLong(arg);
    if (qtype == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(qtype < 0 || qtype >= HK_NTYPES ? -1 : hk_repack_type((int)qtype));
}

static PyObject *py_set_threads(PyObject *self, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > HK_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be between 1 and %d, got %ld", HK_MAX_THREADS, n);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&COMPUTE);
    rc = hk_pool_set_threads((int)n);
    pthread_mutex_unlock(&COMPUTE);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_Format(PyExc_OSError, "could not start %ld threads (running with %d)", n, hk_pool_threads());
        return NULL;
    }
    Py_RETURN_NONE;
}

#define STREAM_AHEAD_MAX (1 << 20)

static PyObject *py_stream_prefetch(PyObject *self, PyObject *args) {
    long ahead = -1;
    if (!PyArg_ParseTuple(args, "|l", &ahead)) return NULL;
    if (PyTuple_GET_SIZE(args) == 1) {
        if (ahead < 0 || ahead > STREAM_AHEAD_MAX || ahead % 64) {
            PyErr_Format(PyExc_ValueError, "stream prefetch must be 0 or a multiple of 64 up to %d bytes, got %ld",
                         STREAM_AHEAD_MAX, ahead);
            return NULL;
        }
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&COMPUTE);
        hk_stream_ahead = (int)ahead;
        pthread_mutex_unlock(&COMPUTE);
        Py_END_ALLOW_THREADS
    }
    return PyLong_FromLong(hk_stream_ahead);
}

static PyObject *py_get_threads(PyObject *self, PyObject *unused) { return PyLong_FromLong(hk_pool_threads()); }

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&COMPUTE);
    rc = hk_select_isa(name);
    pthread_mutex_unlock(&COMPUTE);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_Format(PyExc_ValueError, "CPU ISA %R is unknown or not supported here (this CPU runs: auto, %s)", arg, hk_usable_isa_names());
        return NULL;
    }
    Py_RETURN_NONE;
}

#define LSE_CHUNK 1024 /* floats copied to the stack at a time (exp_sum overwrites what it sums), summed in float */

/* log(sum(exp(x - shift))) of a 1-D float32 array: the denominator of a log-softmax over a vocabulary, in the
   vector exp of the decoder (about 2 ulp) with float lanes per chunk and a double total. No pool, no lock. */
static PyObject *py_log_sum_exp(PyObject *self, PyObject *args) {
    PyObject *obj;
    float shift;
    if (!PyArg_ParseTuple(args, "Of", &obj, &shift)) return NULL;
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != NPY_FLOAT32 || PyArray_NDIM((PyArrayObject *)obj) != 1 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj)) {
        PyErr_SetString(PyExc_ValueError, "x must be a contiguous 1-D float32 array");
        return NULL;
    }
    const float *x = (const float *)PyArray_DATA((PyArrayObject *)obj);
    const npy_intp n = PyArray_DIM((PyArrayObject *)obj, 0);
    const hk_vecops *vo = hk_vecops_active();
    float buf[LSE_CHUNK];
    double total = 0.0;
    for (npy_intp i = 0; i < n; i += LSE_CHUNK) {
        int m = (int)(n - i < LSE_CHUNK ? n - i : LSE_CHUNK);
        memcpy(buf, x + i, sizeof(float) * (size_t)m);
        total += vo->exp_sum(buf, m, shift);
    }
    return PyFloat_FromDouble(log(total));
}

static PyObject *py_isa(PyObject *self, PyObject *unused) { return PyUnicode_FromString(hk_isa_name()); }

static PyObject *py_cpu_features(PyObject *self, PyObject *unused) {
    hk_features f;
    hk_cpu_features(&f);
    return Py_BuildValue("{s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O}",
                         "avx2", f.avx2 ? Py_True : Py_False, "fma", f.fma ? Py_True : Py_False,
                         "f16c", f.f16c ? Py_True : Py_False, "avx512f", f.avx512f ? Py_True : Py_False,
                         "avx512bw", f.avx512bw ? Py_True : Py_False, "avx512vl", f.avx512vl ? Py_True : Py_False,
                         "avx512vnni", f.avx512vnni ? Py_True : Py_False, "avx512bf16", f.avx512bf16 ? Py_True : Py_False,
                         "avxvnni", f.avxvnni ? Py_True : Py_False, "neon", f.neon ? Py_True : Py_False,
                         "dotprod", f.dotprod ? Py_True : Py_False);
}

static PyObject *py_supported_types(PyObject *self, PyObject *unused) {
    PyObject *ids = PyList_New(0);
    if (!ids) return NULL;
    for (int id = 0; id < HK_NTYPES; id++) {
        if (!hk_type_info(id) || hk_is_r16(id)) continue; /* the file types: not the 16-row layouts of repack16 */
        PyObject *v = PyLong_FromLong(id);
        if (!v || PyList_Append(ids, v) != 0) {
            Py_XDECREF(v);
            Py_DECREF(ids);
            return NULL;
        }
        Py_DECREF(v);
    }
    return ids;
}

int hk_strings_add_functions(PyObject *module); /* strings.c */

/* touch_pages(buf, stride) -> the sum of every stride-th byte: pages a memory-mapped file in without holding the
 * GIL through the page faults (a GGUF's tensors are touched before the load measures its RSS). */
static PyObject *py_touch_pages(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t stride;
    if (!PyArg_ParseTuple(args, "y*n", &view, &stride)) return NULL;
    if (stride < 1) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "touch_pages: stride must be at least 1");
        return NULL;
    }
    unsigned long long sum = 0;
    Py_BEGIN_ALLOW_THREADS
    const volatile unsigned char *p = view.buf;
    for (Py_ssize_t i = 0; i < view.len; i += stride) sum += p[i];
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(sum);
}

/* The sum of a buffer's 64-bit words (a whole number of them, modulo 2^64), read front to back with the stream
   prefetched as the 16-row kernels do (hk_stream_ahead bytes ahead into L1, HK_STREAM_L2_TIMES as far into
   L2): the bench's bare read pass (engine/bench/bandwidth.py). */
static PyObject *py_read_words(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    if (view.len % 8) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "read_words: the buffer must be a whole number of 64-bit words");
        return NULL;
    }
    uint64_t sum = 0;
    Py_BEGIN_ALLOW_THREADS
    const uint64_t *p = view.buf;
    const Py_ssize_t lines = view.len / 64, ahead = hk_stream_ahead;
    uint64_t acc[8] = {0};
    for (Py_ssize_t i = 0; i < lines; i++, p += 8) {
        if (ahead) {
            __builtin_prefetch((const char *)p + ahead, 0, 3);                      /* into L1 */
            __builtin_prefetch((const char *)p + HK_STREAM_L2_TIMES * ahead, 0, 2); /* into L2 */
        }
        for (int k = 0; k < 8; k++) acc[k] += p[k];
    }
    for (Py_ssize_t k = 0; k < view.len / 8 % 8; k++) sum += p[k]; /* the words after the last whole line */
    for (int k = 0; k < 8; k++) sum += acc[k];
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(sum);
}

static PyMethodDef METHODS[] = {
    {"matmul", (PyCFunction)(void (*)(void))py_matmul, METH_VARARGS | METH_KEYWORDS, "matmul(w, qtype, x, out=None)"},
    {"get_rows", py_get_rows, METH_VARARGS, "get_rows(w, qtype, ids)"},
    {"repack16", py_repack16, METH_VARARGS, "repack16(w, qtype, out=None) -> (w16, qtype16) or None"},
    {"repack_type", py_repack_type, METH_O, "repack_type(qtype) -> the 16-row type, or -1"},
    {"touch_pages", py_touch_pages, METH_VARARGS, "touch_pages(buf, stride) -> sum of every stride-th byte"},
    {"read_words", py_read_words, METH_VARARGS, "read_words(buf) -> sum of its 64-bit words"},
    {"set_threads", py_set_threads, METH_O, "set_threads(n)"},
    {"get_threads", py_get_threads, METH_NOARGS, "get_threads()"},
    {"set_isa", py_set_isa, METH_O, "set_isa(name)"},
    {"stream_prefetch", py_stream_prefetch, METH_VARARGS, "stream_prefetch([bytes]) -> bytes ahead"},
    {"isa", py_isa, METH_NOARGS, "isa()"},
    {"log_sum_exp", py_log_sum_exp, METH_VARARGS, "log_sum_exp(x, shift)"},
    {"cpu_features", py_cpu_features, METH_NOARGS, "cpu_features()"},
    {"supported_types", py_supported_types, METH_NOARGS, "supported_types()"},
    {NULL, NULL, 0, NULL},
};

static void module_free(void *m) { hk_pool_shutdown(); }

/* A fork while another thread held the lock would leave it locked forever in the child. */
static void unlock_in_child(void) { pthread_mutex_init(&COMPUTE, NULL); }

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_kernels", "Matrix products on packed GGUF blocks (see kernels.py).", -1, METHODS,
    NULL, NULL, NULL, module_free,
};

PyMODINIT_FUNC PyInit__kernels(void) {
    import_array();
    pthread_atfork(NULL, NULL, unlock_in_child);
    if (hk_select_isa("auto") != 0) {
        PyErr_SetString(PyExc_ImportError, "no usable CPU kernel ISA");
        return NULL;
    }
    hk_stream_ahead = hk_default_stream_ahead();
    PyObject *module = PyModule_Create(&MODULE);
    if (module && hk_decoder_add_functions(module) != 0) Py_CLEAR(module);
    if (module && hk_sampling_add_functions(module) != 0) Py_CLEAR(module);
    if (module && hk_strings_add_functions(module) != 0) Py_CLEAR(module);
    return module;
}
