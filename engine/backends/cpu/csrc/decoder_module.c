/* Python bindings of the fused decoder (decoder_new, decoder_forward, decoder_scratch_bytes), added to the
   engine.backends.cpu._kernels module; engine/backends/cpu/decoder.py is their only caller. Every array is
   checked here, and the handle keeps a reference to each one it points into. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"
#include "decoder_module.h"
#include "moe.h"

#define CAPSULE_NAME "hearth.cpu_decoder"
#define STACK_SEQS 64

typedef struct {
    hk_model m;
    PyObject *keep; /* list: the arrays the model points into */
} handle;

static void handle_free(handle *h) {
    if (!h) return;
    hk_model_free(&h->m);
    free(h->m.layers);
    Py_XDECREF(h->keep);
    free(h);
}

static void capsule_destructor(PyObject *capsule) { handle_free(PyCapsule_GetPointer(capsule, CAPSULE_NAME)); }

static int keep(handle *h, PyObject *obj) { return PyList_Append(h->keep, obj); }

/* (array, qtype): packed rows of a (rows, cols) matrix. */
static int take_matrix(handle *h, PyObject *spec, int rows, int cols, hk_matrix *out, const char *what) {
    PyObject *arr;
    int qtype;
    if (!PyArg_ParseTuple(spec, "Oi", &arr, &qtype)) return -1;
    const hk_type *ti = hk_type_info(qtype);
    if (!ti) {
        PyErr_Format(PyExc_ValueError, "%s: GGML type %d is not supported by the CPU kernels", what, qtype);
        return -1;
    }
    PyArrayObject *a = (PyArrayObject *)arr;
    if (!PyArray_Check(arr) || PyArray_TYPE(a) != NPY_UINT8 || PyArray_NDIM(a) != 2 || PyArray_STRIDE(a, 1) != 1 ||
        cols % ti->block != 0 || PyArray_DIM(a, 0) != rows || PyArray_DIM(a, 1) != (npy_intp)cols / ti->block * ti->type_size) {
        PyErr_Format(PyExc_ValueError, "%s must be a uint8 array of %d rows of %d packed %s elements", what, rows, cols, ti->name);
        return -1;
    }
    *out = (hk_matrix){(const uint8_t *)PyArray_DATA(a), PyArray_STRIDE(a, 0), qtype, rows, cols};
    return keep(h, arr);
}

/* A matrix as take_matrix, or None (a zeroed matrix) when optional. */
static int take_optional_matrix(handle *h, PyObject *spec, int optional, int rows, int cols, hk_matrix *out, const char *what) {
    if (spec == Py_None && optional) {
        memset(out, 0, sizeof *out);
        return 0;
    }
    return take_matrix(h, spec, rows, cols, out, what);
}

/* A float32 vector of n (or None when optional). */
static int take_vector(handle *h, PyObject *obj, int n, int optional, const float **out, const char *what) {
    if (obj == Py_None && optional) {
        *out = NULL;
        return 0;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (!PyArray_Check(obj) || PyArray_TYPE(a) != NPY_FLOAT32 || PyArray_NDIM(a) != 1 || PyArray_DIM(a, 0) != n ||
        !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a)) {
        PyErr_Format(PyExc_ValueError, "%s must be a contiguous float32 array of %d", what, n);
        return -1;
    }
    *out = (const float *)PyArray_DATA(a);
    return keep(h, obj);
}

#define LAYER_FIELDS 30

/* The experts of a layer: o[20] router .. o[28] exp_probs_b, o[29] the shared expert's gate (None where the
   layer has no experts). */
static int take_experts(handle *h, PyObject *const *o, hk_layer *L) {
    const hk_config *c = &h->m.c;
    int E = c->n_expert, ff = c->n_ff_exp, d = c->n_embd;
    if (o[20] == Py_None) return 0;
    if (E < 1) {
        PyErr_SetString(PyExc_ValueError, "a layer has experts but the configuration has none");
        return -1;
    }
    if (take_matrix(h, o[20], E, d, &L->router, "router") || take_matrix(h, o[21], E * ff, d, &L->gate_exps, "gate_exps") ||
        take_matrix(h, o[22], E * ff, d, &L->up_exps, "up_exps") || take_matrix(h, o[23], E * d, ff, &L->down_exps, "down_exps") ||
        take_vector(h, o[24], E, 1, &L->b_router, "b_router") || take_vector(h, o[25], E * ff, 1, &L->b_gate_exps, "b_gate_exps") ||
        take_vector(h, o[26], E * ff, 1, &L->b_up_exps, "b_up_exps") || take_vector(h, o[27], E * d, 1, &L->b_down_exps, "b_down_exps") ||
        take_vector(h, o[28], E, 1, &L->exp_probs_b, "exp_probs_b") || take_vector(h, o[29], d, 1, &L->shexp_gate, "shexp_gate"))
        return -1;
    if ((L->gate.data == NULL) != (L->up.data == NULL) || (L->gate.data == NULL) != (L->down.data == NULL) ||
        (L->shexp_gate && !L->gate.data) || (L->gate.data && c->gelu > 1)) {
        PyErr_SetString(PyExc_ValueError, "a shared expert needs its gate, up and down matrices (and silu or gelu)");
        return -1;
    }
    if ((L->b_gate_exps == NULL) != (L->b_up_exps == NULL)) {
        PyErr_SetString(PyExc_ValueError, "the experts' gate and up biases come together");
        return -1;
    }
    return 0;
}

static int take_layer(handle *h, PyObject *spec, int il, hk_layer *L) {
    const hk_config *c = &h->m.c;
    PyObject *o[LAYER_FIELDS];
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != LAYER_FIELDS) {
        PyErr_Format(PyExc_ValueError, "layer %d: expected a %d-tuple", il, LAYER_FIELDS);
        return -1;
    }
    for (int i = 0; i < LAYER_FIELDS; i++) o[i] = PyTuple_GET_ITEM(spec, i);
    int nq = c->n_heads * c->head_dim, nk = c->n_kv_heads * c->head_dim, nv = c->n_kv_heads * c->v_head_dim;
    int na = c->n_heads * c->v_head_dim, moe = o[20] != Py_None;
    int q_norm_n = c->qk_norm_whole ? nq : c->head_dim, k_norm_n = c->qk_norm_whole ? nk : c->head_dim;
    if (take_matrix(h, o[0], nq, c->n_embd, &L->wq, "wq") || take_matrix(h, o[1], nk, c->n_embd, &L->wk, "wk") ||
        take_matrix(h, o[2], nv, c->n_embd, &L->wv, "wv") || take_matrix(h, o[3], c->n_embd, na, &L->wo, "wo") ||
        take_optional_matrix(h, o[4], moe, c->n_ff, c->n_embd, &L->gate, "gate") ||
        take_optional_matrix(h, o[5], moe, c->n_ff, c->n_embd, &L->up, "up") ||
        take_optional_matrix(h, o[6], moe, c->n_embd, c->n_ff, &L->down, "down") ||
        take_vector(h, o[7], c->n_embd, 1, &L->attn_norm, "attn_norm") || take_vector(h, o[8], c->n_embd, 1, &L->ffn_norm, "ffn_norm") ||
        take_vector(h, o[9], nq, 1, &L->bq, "bq") || take_vector(h, o[10], nk, 1, &L->bk, "bk") || take_vector(h, o[11], nv, 1, &L->bv, "bv") ||
        take_vector(h, o[12], q_norm_n, 1, &L->q_norm, "q_norm") || take_vector(h, o[13], k_norm_n, 1, &L->k_norm, "k_norm") ||
        take_vector(h, o[14], c->n_embd, 1, &L->post_attn_norm, "post_attn_norm") ||
        take_vector(h, o[15], c->n_embd, 1, &L->post_ffn_norm, "post_ffn_norm") ||
        take_vector(h, o[18], c->n_embd, 1, &L->bo, "bo") || take_vector(h, o[19], c->n_heads, 1, &L->sinks, "sinks") ||
        take_experts(h, o, L))
        return -1;
    if (!moe && c->gelu > 1) {
        PyErr_Format(PyExc_ValueError, "layer %d: the dense FFN has no swiglu_oai activation", il);
        return -1;
    }
    L->rope_set = (int)PyLong_AsLong(o[16]);
    L->window = (int)PyLong_AsLong(o[17]);
    if (PyErr_Occurred()) return -1;
    if ((L->bq == NULL) != (L->bk == NULL) || (L->bq == NULL) != (L->bv == NULL) || (L->q_norm == NULL) != (L->k_norm == NULL) ||
        L->rope_set < -1 || L->rope_set >= c->n_rope_sets || L->window < 0) {
        PyErr_Format(PyExc_ValueError, "layer %d: inconsistent biases, norms, RoPE set or window", il);
        return -1;
    }
    return 0;
}

/* ints: n_layers, n_embd, n_ff, n_heads, n_kv_heads, head_dim, v_head_dim, n_vocab, rope_dim, rope_neox, gelu,
   max_rows, qk_norm_whole, attn_temp_floor, n_expert, n_expert_used, n_ff_exp, expert_gating, expert_norm;
   floats: rms_eps, embed_scale, attn_scale, attn_softcap, final_softcap, residual_scale, logit_scale, rope_mscale,
   attn_temp_scale, expert_weights_scale (decoder.h, hk_config). */
static int take_config(hk_config *c, PyObject *ints, PyObject *floats) {
    if (!PyArg_ParseTuple(ints, "iiiiiiiiiiiiiiiiiii", &c->n_layers, &c->n_embd, &c->n_ff, &c->n_heads, &c->n_kv_heads,
                          &c->head_dim, &c->v_head_dim, &c->n_vocab, &c->rope_dim, &c->rope_neox, &c->gelu, &c->max_rows,
                          &c->qk_norm_whole, &c->attn_temp_floor, &c->n_expert, &c->n_expert_used, &c->n_ff_exp,
                          &c->expert_gating, &c->expert_norm) ||
        !PyArg_ParseTuple(floats, "ffffffffff", &c->rms_eps, &c->embed_scale, &c->attn_scale, &c->attn_softcap, &c->final_softcap,
                          &c->residual_scale, &c->logit_scale, &c->rope_mscale, &c->attn_temp_scale, &c->expert_weights_scale))
        return -1;
    if (c->n_expert < 0 || c->n_expert > HK_MAX_EXPERTS || c->n_expert_used < 0 || c->n_expert_used > HK_MAX_EXPERTS_USED ||
        c->n_expert_used > c->n_expert || (c->n_expert && (c->n_expert_used < 1 || c->n_ff_exp < 1)) || c->expert_gating < 0 ||
        c->expert_gating > 2 || c->gelu < 0 || c->gelu > 2 || !isfinite(c->expert_weights_scale)) {
        PyErr_SetString(PyExc_ValueError, "decoder expert configuration out of range");
        return -1;
    }
    if (c->n_layers < 1 || c->n_embd < 1 || c->n_ff < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads ||
        c->head_dim < 1 || c->v_head_dim < 1 || c->head_dim + c->v_head_dim > 16384 || c->n_vocab < 1 || c->rope_dim < 0 ||
        c->rope_dim % 2 || c->rope_dim > c->head_dim || c->max_rows < 1 || c->max_rows > 65536 || c->attn_temp_floor < 0 ||
        !(c->attn_softcap >= 0.0f) || !(c->final_softcap >= 0.0f) || !isfinite(c->residual_scale) || !isfinite(c->logit_scale) ||
        !isfinite(c->rope_mscale) || !isfinite(c->attn_temp_scale) ||
        !isfinite(c->attn_softcap) || !isfinite(c->final_softcap)) {
        PyErr_SetString(PyExc_ValueError, "decoder configuration out of range");
        return -1;
    }
    return 0;
}

static PyObject *py_decoder_new(PyObject *self, PyObject *args) {
    PyObject *ints, *floats, *embd, *output, *output_norm, *inv_freq, *layers;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OOO:decoder_new", &PyTuple_Type, &ints, &PyTuple_Type, &floats, &PyTuple_Type, &embd,
                          &PyTuple_Type, &output, &output_norm, &inv_freq, &layers))
        return NULL;
    handle *h = calloc(1, sizeof *h);
    if (!h) return PyErr_NoMemory();
    hk_model *m = &h->m;
    if (!(h->keep = PyList_New(0)) || take_config(&m->c, ints, floats) != 0) goto fail;
    PyArrayObject *fr = (PyArrayObject *)inv_freq;
    if (!PyArray_Check(inv_freq) || PyArray_TYPE(fr) != NPY_FLOAT64 || PyArray_NDIM(fr) != 2 || !PyArray_IS_C_CONTIGUOUS(fr) ||
        PyArray_DIM(fr, 0) < 1 || PyArray_DIM(fr, 0) > HK_MAX_ROPE_SETS || PyArray_DIM(fr, 1) != m->c.rope_dim / 2) {
        PyErr_Format(PyExc_ValueError, "inv_freq must be a contiguous float64 array (1 to %d, rope_dim / 2)", HK_MAX_ROPE_SETS);
        goto fail;
    }
    m->c.n_rope_sets = (int)PyArray_DIM(fr, 0);
    m->inv_freq = (const double *)PyArray_DATA(fr);
    if (keep(h, inv_freq) || take_matrix(h, embd, m->c.n_vocab, m->c.n_embd, &m->embd, "token_embd") ||
        take_matrix(h, output, m->c.n_vocab, m->c.n_embd, &m->output, "output") ||
        take_vector(h, output_norm, m->c.n_embd, 0, &m->output_norm, "output_norm"))
        goto fail;
    if (!PySequence_Check(layers) || PySequence_Size(layers) != m->c.n_layers) {
        PyErr_Format(PyExc_ValueError, "expected %d layers", m->c.n_layers);
        goto fail;
    }
    if (!(m->layers = calloc(m->c.n_layers, sizeof(hk_layer)))) {
        PyErr_NoMemory();
        goto fail;
    }
    for (int il = 0; il < m->c.n_layers; il++) {
        PyObject *spec = PySequence_GetItem(layers, il);
        int rc = spec ? take_layer(h, spec, il, &m->layers[il]) : -1;
        Py_XDECREF(spec);
        if (rc != 0) goto fail;
    }
    int rc = hk_model_init(m);
    if (rc == -3) {
        PyErr_SetString(PyExc_ValueError, "the CPU decoder takes one sliding window size for all sliding layers");
        goto fail;
    } else if (rc != 0) {
        PyErr_NoMemory();
        goto fail;
    }
    PyObject *capsule = PyCapsule_New(h, CAPSULE_NAME, capsule_destructor);
    if (!capsule) goto fail;
    return capsule;
fail:
    handle_free(h);
    return NULL;
}

/* The HK_KV_* type of a cache array: float32, float16, or uint8 rows of q8_0 blocks; -1 for anything else. */
static int cache_type(PyArrayObject *a) {
    switch (PyArray_TYPE(a)) {
    case NPY_FLOAT32: return HK_KV_F32;
    case NPY_FLOAT16: return HK_KV_F16;
    case NPY_UINT8: return HK_KV_Q8_0;
    default: return -1;
    }
}

/* A cache's keys or values: (n_layers, n_kv_heads, capacity, dim) float32 or float16, or (..., dim / 32 * 34)
   uint8 q8_0 blocks (dim a multiple of 32), writeable, C order; keys and values of one type and capacity. */
static int take_cache(const hk_config *c, PyObject *obj, int dim, int *capacity, int *kv_type) {
    PyArrayObject *a = (PyArrayObject *)obj;
    int type = PyArray_Check(obj) ? cache_type(a) : -1;
    npy_intp width = type == HK_KV_Q8_0 ? (dim % 32 ? -1 : dim / 32 * 34) : dim;
    if (type < 0 || PyArray_NDIM(a) != 4 || !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a) || !PyArray_ISWRITEABLE(a) ||
        PyArray_DIM(a, 0) != c->n_layers || PyArray_DIM(a, 1) != c->n_kv_heads || PyArray_DIM(a, 3) != width ||
        PyArray_DIM(a, 2) > INT_MAX || (*capacity >= 0 && (PyArray_DIM(a, 2) != *capacity || type != *kv_type))) {
        PyErr_SetString(PyExc_ValueError, "a KV cache array has the wrong type or shape for this model");
        return -1;
    }
    *capacity = (int)PyArray_DIM(a, 2);
    *kv_type = type;
    return 0;
}

static int take_seqs(const hk_config *c, PyObject *caches, hk_seq *seqs, Py_ssize_t n_seqs) {
    for (Py_ssize_t s = 0; s < n_seqs; s++) {
        PyObject *item = PySequence_Fast_GET_ITEM(caches, s), *k, *v;
        hk_seq *q = &seqs[s];
        if (!PyArg_ParseTuple(item, "OOii", &k, &v, &q->n_past, &q->n_rows)) return -1;
        q->capacity = -1;
        if (take_cache(c, k, c->head_dim, &q->capacity, &q->kv_type) || take_cache(c, v, c->v_head_dim, &q->capacity, &q->kv_type))
            return -1;
        q->k = PyArray_DATA((PyArrayObject *)k);
        q->v = PyArray_DATA((PyArrayObject *)v);
    }
    return 0;
}

static PyObject *py_decoder_forward(PyObject *self, PyObject *args) {
    PyObject *capsule, *tokobj, *caches_obj, *logobj;
    int mode;
    if (!PyArg_ParseTuple(args, "OOOOi:decoder_forward", &capsule, &tokobj, &caches_obj, &logobj, &mode)) return NULL;
    handle *h = PyCapsule_GetPointer(capsule, CAPSULE_NAME);
    if (!h) return NULL;
    const hk_config *c = &h->m.c;
    PyArrayObject *tokens = (PyArrayObject *)tokobj;
    if (!PyArray_Check(tokobj) || PyArray_TYPE(tokens) != NPY_INT32 || PyArray_NDIM(tokens) != 1 || !PyArray_IS_C_CONTIGUOUS(tokens)) {
        PyErr_SetString(PyExc_ValueError, "tokens must be a contiguous int32 array");
        return NULL;
    }
    PyObject *caches = PySequence_Fast(caches_obj, "caches must be a sequence of (keys, values, n_past, n_rows)");
    if (!caches) return NULL;
    Py_ssize_t n_seqs = PySequence_Fast_GET_SIZE(caches), n = PyArray_DIM(tokens, 0);
    hk_seq stack[STACK_SEQS], *seqs = n_seqs <= STACK_SEQS ? stack : malloc(sizeof(hk_seq) * (size_t)n_seqs);
    PyObject *result = NULL;
    if (!seqs) {
        PyErr_NoMemory();
        goto done;
    }
    if (n_seqs < 1 || n_seqs > INT_MAX || take_seqs(c, caches, seqs, n_seqs) != 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "decoder_forward needs at least one cache");
        goto done;
    }
    Py_ssize_t rows = 0;
    for (Py_ssize_t s = 0; s < n_seqs; s++) rows += seqs[s].n_rows;
    if (rows != n) {
        PyErr_Format(PyExc_ValueError, "the caches take %zd rows, got %zd tokens", rows, n);
        goto done;
    }
    float *logits = NULL;
    if (mode != HK_LOGITS_NONE) {
        PyArrayObject *lg = (PyArrayObject *)logobj;
        npy_intp want = mode == HK_LOGITS_ALL ? n : n_seqs;
        if (mode != HK_LOGITS_LAST && mode != HK_LOGITS_ALL) {
            PyErr_SetString(PyExc_ValueError, "unknown logits mode");
            goto done;
        }
        if (!PyArray_Check(logobj) || PyArray_TYPE(lg) != NPY_FLOAT32 || PyArray_NDIM(lg) != 2 || !PyArray_IS_C_CONTIGUOUS(lg) ||
            !PyArray_ISWRITEABLE(lg) || PyArray_DIM(lg, 0) != want || PyArray_DIM(lg, 1) != c->n_vocab) {
            PyErr_Format(PyExc_ValueError, "logits must be a writeable contiguous float32 array (%zd, %d)", (Py_ssize_t)want, c->n_vocab);
            goto done;
        }
        logits = (float *)PyArray_DATA(lg);
    }
    const int32_t *tok = (const int32_t *)PyArray_DATA(tokens);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&hk_compute);
    rc = hk_model_forward(&h->m, tok, seqs, (int)n_seqs, logits, mode);
    pthread_mutex_unlock(&hk_compute);
    Py_END_ALLOW_THREADS
    if (rc == -1)
        PyErr_NoMemory();
    else if (rc == -2)
        PyErr_Format(PyExc_ValueError, "token id out of range 0..%d", c->n_vocab - 1);
    else if (rc != 0)
        PyErr_Format(PyExc_ValueError, "a sequence has no rows, no room in its cache, or the call has more than %d rows", c->max_rows);
    else
        result = Py_NewRef(Py_None);
done:
    if (seqs != stack) free(seqs);
    Py_DECREF(caches);
    return result;
}

static PyObject *py_decoder_scratch_bytes(PyObject *self, PyObject *capsule) {
    handle *h = PyCapsule_GetPointer(capsule, CAPSULE_NAME);
    if (!h) return NULL;
    size_t bytes;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&hk_compute); /* a running forward may grow the attention scratch */
    bytes = h->m.arena.size + h->m.arena.att_size;
    pthread_mutex_unlock(&hk_compute);
    Py_END_ALLOW_THREADS
    return PyLong_FromSize_t(bytes);
}

static PyMethodDef METHODS[] = {
    {"decoder_new", py_decoder_new, METH_VARARGS,
     "decoder_new(ints, floats, embd, output, output_norm, inv_freq, layers) -> handle"},
    {"decoder_forward", py_decoder_forward, METH_VARARGS, "decoder_forward(handle, tokens, caches, logits, mode)"},
    {"decoder_scratch_bytes", py_decoder_scratch_bytes, METH_O, "decoder_scratch_bytes(handle) -> int"},
    {NULL, NULL, 0, NULL},
};

int hk_decoder_add_functions(PyObject *module) {
    if (_import_array() < 0) return -1; /* this file's own copy of NumPy's C API table */
    return PyModule_AddFunctions(module, METHODS);
}
