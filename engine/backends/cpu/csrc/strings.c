/* Packed string arrays for GGUF vocabularies: splitting a run of (u64 length, bytes) elements, and an
 * open-addressing index over the packed UTF-8 bytes (engine/packed_strings.py holds the Python side and the
 * fallback). Both loops run with the GIL released, so a GUI thread is not paused while a 150k-token
 * vocabulary loads. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* FNV-1a, 64 bits: token texts are short, so a byte loop is as fast as anything wider. */
static uint64_t byte_hash(const unsigned char *s, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h;
}

/* pack_strings(buf, start, count) -> (data, ends, end): the elements read until one runs past the end. */
static PyObject *py_pack_strings(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, count;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &start, &count)) return NULL;
    if (start < 0 || start > view.len || count < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "pack_strings: start or count out of range");
        return NULL;
    }
    const unsigned char *buf = view.buf;
    uint64_t size = (uint64_t)view.len;
    PyObject *ends = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(uint64_t));
    if (!ends) { PyBuffer_Release(&view); return NULL; }
    uint64_t *end_of = (uint64_t *)PyBytes_AS_STRING(ends);
    Py_ssize_t done = 0;
    uint64_t pos = (uint64_t)start, total = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; done < count; done++) {
        uint64_t n;
        if (size - pos < 8) break;
        memcpy(&n, buf + pos, 8);  /* GGUF is little-endian, as are the CPUs this extension builds for */
        if (size - pos - 8 < n) break;
        total += n;
        end_of[done] = total;
        pos += 8 + n;
    }
    Py_END_ALLOW_THREADS
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!data) { Py_DECREF(ends); PyBuffer_Release(&view); return NULL; }
    char *out = PyBytes_AS_STRING(data);
    Py_BEGIN_ALLOW_THREADS
    uint64_t src = (uint64_t)start, prev = 0;
    for (Py_ssize_t i = 0; i < done; i++) {
        uint64_t n = end_of[i] - prev;
        memcpy(out + prev, buf + src + 8, n);
        prev = end_of[i];
        src += 8 + n;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (done < count && _PyBytes_Resize(&ends, done * (Py_ssize_t)sizeof(uint64_t)) != 0) {
        Py_DECREF(data);
        return NULL;
    }
    PyObject *result = Py_BuildValue("(NNK)", data, ends, (unsigned long long)pos);
    return result;
}

/* Whether s[0:n] is strict UTF-8 as Python's decoder reads it (no overlong forms, surrogates or values above
 * U+10FFFF). */
static int valid_utf8(const unsigned char *s, uint64_t n) {
    uint64_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        int len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return 0;
        if (n - i < (uint64_t)len) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += len;
    }
    return 1;
}

/* first_invalid_utf8(data, ends) -> the first element that is not UTF-8 on its own, or -1. */
static PyObject *py_first_invalid_utf8(PyObject *self, PyObject *args) {
    Py_buffer data, ends;
    if (!PyArg_ParseTuple(args, "y*y*", &data, &ends)) return NULL;
    Py_ssize_t n = ends.len / (Py_ssize_t)sizeof(uint64_t), bad = -1;
    const uint64_t *end_of = ends.buf;
    int fits = n == 0 || end_of[n - 1] <= (uint64_t)data.len;
    for (Py_ssize_t i = 1; fits && i < n; i++) fits = end_of[i - 1] <= end_of[i];
    if (fits) {
        Py_BEGIN_ALLOW_THREADS
        uint64_t prev = 0;
        for (Py_ssize_t i = 0; i < n && bad < 0; i++) {
            if (!valid_utf8((const unsigned char *)data.buf + prev, end_of[i] - prev)) bad = i;
            prev = end_of[i];
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&ends);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "first_invalid_utf8: ends must rise and fit the data");
        return NULL;
    }
    return PyLong_FromSsize_t(bad);
}

/* The index: slots hold string positions (-1 free), tags the hash bits above the slot bits. */
typedef struct {
    PyObject_HEAD
    PyObject *data;        /* bytes, the packed strings */
    Py_buffer offsets;     /* (n + 1,) uint32 or uint64 */
    int32_t *slots;        /* (n_slots,) */
    uint32_t *tags;        /* (n,) */
    uint64_t mask;
    Py_ssize_t n, size, duplicates, nbytes;
} StringTable;

static inline uint64_t offset_at(const StringTable *t, Py_ssize_t i) {
    return t->offsets.itemsize == 4 ? ((const uint32_t *)t->offsets.buf)[i] : ((const uint64_t *)t->offsets.buf)[i];
}

/* The position of s, or -1 with *free_slot set to where it would go. */
static Py_ssize_t probe(const StringTable *t, const unsigned char *s, Py_ssize_t n, uint64_t h, uint64_t *free_slot) {
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(t->data);
    uint32_t tag = (uint32_t)(h >> 32);
    uint64_t pos = h & t->mask;
    int32_t j;
    while ((j = t->slots[pos]) >= 0) {
        if (t->tags[j] == tag) {
            uint64_t a = offset_at(t, j), b = offset_at(t, j + 1);
            if ((Py_ssize_t)(b - a) == n && memcmp(data + a, s, (size_t)n) == 0) return j;
        }
        pos = (pos + 1) & t->mask;
    }
    if (free_slot) *free_slot = pos;
    return -1;
}

static void build(StringTable *t) {
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(t->data);
    for (Py_ssize_t i = 0; i < t->n; i++) {
        uint64_t a = offset_at(t, i), b = offset_at(t, i + 1), slot = 0;
        uint64_t h = byte_hash(data + a, (Py_ssize_t)(b - a));
        if (probe(t, data + a, (Py_ssize_t)(b - a), h, &slot) >= 0) {
            t->duplicates++;
        } else {
            t->tags[i] = (uint32_t)(h >> 32);
            t->slots[slot] = (int32_t)i;
            t->size++;
        }
    }
}

static PyObject *table_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *data, *offsets;
    if (!PyArg_ParseTuple(args, "SO:StringTable", &data, &offsets)) return NULL;
    StringTable *t = (StringTable *)type->tp_alloc(type, 0);
    if (!t) return NULL;
    if (PyObject_GetBuffer(offsets, &t->offsets, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
        Py_DECREF(t);
        return NULL;
    }
    Py_INCREF(data);
    t->data = data;
    if ((t->offsets.itemsize != 4 && t->offsets.itemsize != 8) || t->offsets.len < t->offsets.itemsize) {
        PyErr_SetString(PyExc_ValueError, "StringTable: offsets must be n + 1 4- or 8-byte ints");
        Py_DECREF(t);
        return NULL;
    }
    t->n = t->offsets.len / t->offsets.itemsize - 1;
    if (t->n > INT32_MAX / 2 || offset_at(t, t->n) > (uint64_t)PyBytes_GET_SIZE(data)) {
        PyErr_SetString(PyExc_ValueError, "StringTable: offsets do not fit the data");
        Py_DECREF(t);
        return NULL;
    }
    uint64_t n_slots = 8;
    while (n_slots < 2 * (uint64_t)t->n) n_slots <<= 1;  /* load factor at most 1/2: probes stay short */
    t->mask = n_slots - 1;
    t->slots = malloc(n_slots * sizeof(int32_t));
    t->tags = calloc(t->n ? (size_t)t->n : 1, sizeof(uint32_t));
    if (!t->slots || !t->tags) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    memset(t->slots, 0xFF, n_slots * sizeof(int32_t));
    t->nbytes = (Py_ssize_t)(n_slots * sizeof(int32_t) + (size_t)t->n * sizeof(uint32_t));
    Py_BEGIN_ALLOW_THREADS
    build(t);
    Py_END_ALLOW_THREADS
    return (PyObject *)t;
}

static void table_dealloc(StringTable *t) {
    free(t->slots);
    free(t->tags);
    if (t->offsets.obj) PyBuffer_Release(&t->offsets);
    Py_XDECREF(t->data);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* get(text, default=None): one call per candidate BPE merge, so no Python objects on the way. */
static PyObject *table_get(StringTable *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(text, default=None)");
        return NULL;
    }
    PyObject *fallback = nargs == 2 ? args[1] : Py_None;
    if (!PyUnicode_Check(args[0])) return Py_NewRef(fallback);
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(args[0], &n);
    PyObject *encoded = NULL;
    if (!s) {  /* lone surrogates: stored with surrogatepass, looked up the same way */
        PyErr_Clear();
        encoded = PyUnicode_AsEncodedString(args[0], "utf-8", "surrogatepass");
        if (!encoded) return NULL;
        s = PyBytes_AS_STRING(encoded);
        n = PyBytes_GET_SIZE(encoded);
    }
    Py_ssize_t j = probe(t, (const unsigned char *)s, n, byte_hash((const unsigned char *)s, n), NULL);
    Py_XDECREF(encoded);
    return j >= 0 ? PyLong_FromSsize_t(j) : Py_NewRef(fallback);
}

static PyMethodDef TABLE_METHODS[] = {
    {"get", (PyCFunction)(void (*)(void))table_get, METH_FASTCALL, "get(text, default=None): position or default"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef TABLE_MEMBERS[] = {
    {"size", T_PYSSIZET, offsetof(StringTable, size), READONLY, "distinct strings"},
    {"duplicates", T_PYSSIZET, offsetof(StringTable, duplicates), READONLY, "strings equal to an earlier one"},
    {"nbytes", T_PYSSIZET, offsetof(StringTable, nbytes), READONLY, "bytes of the slots and tags"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject STRING_TABLE = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "engine.backends.cpu._kernels.StringTable",
    .tp_basicsize = sizeof(StringTable),
    .tp_dealloc = (destructor)table_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "StringTable(data: bytes, offsets): open-addressing index of packed UTF-8 strings (first kept)",
    .tp_methods = TABLE_METHODS,
    .tp_members = TABLE_MEMBERS,
    .tp_new = table_new,
};

static PyMethodDef STRING_FUNCTIONS[] = {
    {"pack_strings", py_pack_strings, METH_VARARGS,
     "pack_strings(buf, start, count) -> (data, ends as u64 bytes, end position)"},
    {"first_invalid_utf8", py_first_invalid_utf8, METH_VARARGS,
     "first_invalid_utf8(data, ends) -> first element (cut at the u64 ends) that is not UTF-8, or -1"},
    {NULL, NULL, 0, NULL},
};

int hk_strings_add_functions(PyObject *module) {
    if (PyType_Ready(&STRING_TABLE) < 0) return -1;
    if (PyModule_AddFunctions(module, STRING_FUNCTIONS) != 0) return -1;
    Py_INCREF(&STRING_TABLE);
    if (PyModule_AddObject(module, "StringTable", (PyObject *)&STRING_TABLE) != 0) {
        Py_DECREF(&STRING_TABLE);
        return -1;
    }
    return 0;
}
