/* The fused decoder: every layer of a forward call in C, on the packed weights, with the thread pool.

   A call's rows go through the layers together, as a sequence of phases: per layer, row work (norms, biases,
   RoPE, residuals, activation quantization) alternates with four products (q/k/v in one phase, the output
   projection, gate/up with the activation, down) and the attention. The products read the activations
   quantized once per row, whatever number of matrices share them.

   Architectures differ only by the config and layer fields the row work reads (decoder.h): norms present or
   not, per-head or whole-projection q/k norms, RoPE sets per layer (or none), residual and logit scales,
   softcaps, the queries' temperature tuning. Nothing here is per architecture.

   The whole call is one job of the thread pool. Every thread walks the phases in order, claims units of
   work (row ranges, row chunks of the matrices, attention tasks) from each phase's counter, and waits for
   the phase's last unit before the next. A thread the OS has not scheduled yet holds up no phase: it joins
   whichever is running when it arrives (on a loaded machine the caller may do it all), and the pool waits
   for it once, at the end of the call, instead of once per product. */
#include "decoder.h"

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "moe.h"
#include "pool.h"
#include "products.h"
#include "vecops.h"

#define YIELD_EVERY 64         /* polls of a phase counter between two sched_yield calls (as pool.c) */

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }
static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

/* -- one call's working state: views into the arena, shapes in comments */

typedef struct {
    hk_model *m;
    const hk_config *c;
    const hk_isa *isa;
    const hk_vecops *vo;
    const hk_seq *seqs;
    const int32_t *tokens;
    int n, n_seqs, n_out;
    float *x;               /* (R, n_embd) residual stream */
    float *h;               /* (R, n_embd) normed input of a product */
    float *q, *k, *v;       /* (R, n_heads * head_dim), (R, n_kv_heads * head_dim), (R, n_kv_heads * v_head_dim) */
    float *att_out;         /* (R, n_heads * v_head_dim) */
    float *o;               /* (R, n_embd) output of wo and down */
    float *g, *u;           /* (R, n_ff) gate (then the activation product) and up */
    float *rope_cos, *rope_sin; /* (R, n_rope_sets, rope_dim / 2), times rope_mscale */
    float *logits;          /* (n_out, n_vocab): the caller's */
    hk_act_rows acts;           /* per kind: (R, hk_act_bytes(kind, widest input)) and (R,) descriptors */
    int *row_seq, *row_pos, *out_rows; /* (R,) */
    size_t *row_slot;                  /* (R,) attention partial offsets */
    hk_att att;                        /* the attention's inputs; layer, window and tasks set per phase */
    hk_att_task *att_tasks[2];         /* the plans for window 0 and for the sliding window */
    int n_att_tasks[2];
    int n_phases, rows_per_unit;
    int *phase_units;                  /* (n_phases,) */
    atomic_int *phase_sync;            /* (n_phases, 2): units claimed, units done */
    hk_moe moe;                        /* the mixture-of-experts views (moe.h) */
} fwd;

static int widest_input(const hk_config *c) { return imax(imax(c->n_embd, c->n_heads * c->v_head_dim), c->n_ff); }

/* A layer with experts runs PH_MOE_GROUP (none without) and the moe.h functions in PH_GLU .. PH_FFN_OUT. */
enum { PH_EMBED, PH_ATTN_IN, PH_QKV, PH_QKV_POST, PH_ATTEND, PH_ATTN_OUT, PH_WO, PH_FFN_IN, PH_MOE_GROUP, PH_GLU,
       PH_DOWN_IN, PH_DOWN, PH_FFN_OUT, PH_OUT_IN, PH_OUTPUT, PH_OUT_POST };
#define LAYER_PHASES (PH_FFN_OUT - PH_ATTN_IN + 1)

static int max_phases(const hk_config *c) { return 1 + LAYER_PHASES * c->n_layers + 3; }

/* Whether the logits need a pass after the output product (logit scale, final softcap). */
static int logits_post(const hk_config *c) { return c->logit_scale != 1.0f || c->final_softcap > 0.0f; }

/* Lay the views out from base (or only count the bytes when f is NULL). */
static size_t layout(const hk_config *c, uint8_t *base, fwd *f) {
    size_t off = 0, R = (size_t)c->max_rows;
#define TAKE(field, type, count)                                        \
    do {                                                                \
        if (f) f->field = (type *)(void *)(base + off);                 \
        off += align64(sizeof(type) * (size_t)(count));                 \
    } while (0)
    TAKE(x, float, R * c->n_embd);
    TAKE(h, float, R * c->n_embd);
    TAKE(q, float, R * c->n_heads * c->head_dim);
    TAKE(k, float, R * c->n_kv_heads * c->head_dim);
    TAKE(v, float, R * c->n_kv_heads * c->v_head_dim);
    TAKE(att_out, float, R * c->n_heads * c->v_head_dim);
    TAKE(o, float, R * c->n_embd);
    TAKE(g, float, R * c->n_ff);
    TAKE(u, float, R * c->n_ff);
    TAKE(rope_cos, float, R * imax(1, c->rope_dim / 2) * c->n_rope_sets);
    TAKE(rope_sin, float, R * imax(1, c->rope_dim / 2) * c->n_rope_sets);
    for (int kind = 0; kind < HK_ACT_KINDS; kind++) {
        size_t stride = hk_act_bytes(kind, widest_input(c));
        if (f) f->acts.stride[kind] = stride;
        TAKE(acts.mem[kind], uint8_t, R * stride);
        TAKE(acts.acts[kind], hk_act, R);
    }
    TAKE(row_seq, int, R);
    TAKE(row_pos, int, R);
    TAKE(out_rows, int, R);
    TAKE(row_slot, size_t, R);
    TAKE(phase_units, int, max_phases(c));
    TAKE(phase_sync, atomic_int, 2 * (size_t)max_phases(c));
#undef TAKE
    off += hk_moe_layout(c, base ? base + off : NULL, f ? &f->moe : NULL);
    return off;
}

int hk_model_init(hk_model *m) {
    memset(&m->arena, 0, sizeof m->arena);
    const hk_config *c = &m->c;
    if (c->n_rope_sets < 1 || c->n_rope_sets > HK_MAX_ROPE_SETS || c->head_dim + c->v_head_dim > 16384 || c->max_rows < 1) return -3;
    if (c->n_expert < 0 || c->n_expert > HK_MAX_EXPERTS || c->n_expert_used < 0 || c->n_expert_used > HK_MAX_EXPERTS_USED ||
        c->n_expert_used > c->n_expert)
        return -3;
    for (int l = 0, window = 0; l < m->c.n_layers; l++) { /* two plans: global and one sliding window */
        if (m->layers[l].window && window && m->layers[l].window != window) return -3;
        if (m->layers[l].window) window = m->layers[l].window;
    }
    size_t size = layout(&m->c, NULL, NULL);
    if (posix_memalign(&m->arena.mem, 64, size) != 0) return -1;
    m->arena.size = size;
    return 0;
}

void hk_model_free(hk_model *m) {
    free(m->arena.mem);
    free(m->arena.att_mem);
    memset(&m->arena, 0, sizeof m->arena);
}

/* Room for one call's attention plans (two) and partial states; grows with the context, never shrinks. */
static int reserve_attention(hk_model *m, size_t partial_floats, int max_tasks) {
    size_t tasks_bytes = 2 * align64(sizeof(hk_att_task) * (size_t)max_tasks), need = tasks_bytes + sizeof(float) * partial_floats;
    if (need > m->arena.att_size) {
        void *p = NULL;
        size_t grown = need + need / 4;
        if (posix_memalign(&p, 64, grown) != 0) return -1;
        free(m->arena.att_mem);
        m->arena.att_mem = p;
        m->arena.att_size = grown;
    }
    m->arena.att_tasks_bytes = tasks_bytes;
    return 0;
}

/* The product phase's matrices, inputs and outputs. */
static void product_of(const fwd *f, int kind, int layer, hk_product *p) {
    const hk_layer *L = &f->m->layers[layer < f->c->n_layers ? layer : 0];
    const hk_matrix *w[3] = {NULL, NULL, NULL};
    float *out[3] = {NULL, NULL, NULL};
    int n = f->n;
    switch (kind) {
    case PH_QKV: w[0] = &L->wq, out[0] = f->q, w[1] = &L->wk, out[1] = f->k, w[2] = &L->wv, out[2] = f->v; break;
    case PH_WO: w[0] = &L->wo, out[0] = f->o; break;
    case PH_GLU: w[0] = &L->gate, out[0] = f->g, w[1] = &L->up, out[1] = f->u; break;
    case PH_DOWN: w[0] = &L->down, out[0] = L->router.data ? f->h : f->o; break; /* a shared expert: into h */
    default: w[0] = &f->m->output, out[0] = f->logits, n = f->n_out; break; /* PH_OUTPUT */
    }
    hk_product_init(p, f->isa, f->vo, &f->acts, n, w, out, kind == PH_GLU, f->c->gelu);
}

/* -- row work: one row of one layer */

/* y = x / rms(x) * w, in the reference's order of float32 operations */
static void rms_norm(const fwd *f, const float *x, const float *w, float *y, int n) {
    float mean = f->vo->sum_sq(x, n) / (float)n;
    f->vo->scale_mul(y, x, 1.0f / sqrtf(mean + f->c->rms_eps), w, n);
}

static void add_into(float *x, const float *y, int n) {
    for (int i = 0; i < n; i++) x[i] += y[i];
}

/* The row's token embedding, and the cos and sin of its position for every RoPE set (times rope_mscale). */
static void row_embed(const fwd *f, int layer, int r) {
    const hk_config *c = f->c;
    const hk_matrix *e = &f->m->embd;
    const int half = c->rope_dim / 2, sets = c->n_rope_sets;
    float *x = f->x + (size_t)r * c->n_embd;
    hk_matrix_row(e->type, e->data, e->stride, f->tokens[r], c->n_embd, x);
    if (c->embed_scale != 1.0f) f->vo->scale(x, c->n_embd, c->embed_scale);
    for (int s = 0; s < sets; s++)
        for (int i = 0; i < half; i++) {
            double angle = (double)f->row_pos[r] * f->m->inv_freq[(size_t)s * half + i];
            f->rope_cos[((size_t)r * sets + s) * half + i] = (float)(cos(angle) * c->rope_mscale);
            f->rope_sin[((size_t)r * sets + s) * half + i] = (float)(sin(angle) * c->rope_mscale);
        }
}

/* The cache slot (in positions) of row r's key and value for kv head h of a layer. */
static size_t kv_slot(const fwd *f, const hk_seq *s, int layer, int h, int r) {
    return ((size_t)layer * f->c->n_kv_heads + h) * s->capacity + f->row_pos[r];
}

/* Ask for the cache lines row_qkv_post will write this row's keys and values into, while the q/k/v product
   runs: a decode row's slot is a cold line in every kv head of every layer of its sequence's cache. */
static void prefetch_kv_slots(const fwd *f, int layer, int r) {
    const hk_config *c = f->c;
    const hk_seq *s = &f->seqs[f->row_seq[r]];
    const size_t kb = hk_kv_row_bytes(s->kv_type, c->head_dim), vb = hk_kv_row_bytes(s->kv_type, c->v_head_dim);
    for (int h = 0; h < c->n_kv_heads; h++) {
        size_t at = kv_slot(f, s, layer, h, r);
        for (size_t b = 0; b < kb; b += 64) __builtin_prefetch((const char *)s->k + at * kb + b, 1, 3);
        for (size_t b = 0; b < vb; b += 64) __builtin_prefetch((const char *)s->v + at * vb + b, 1, 3);
    }
}

/* h = the block's input: x normed by w, or x itself where the architecture has no norm before the block. */
static void block_input(const fwd *f, const float *x, const float *w, float *h) {
    if (w)
        rms_norm(f, x, w, h, f->c->n_embd);
    else
        memcpy(h, x, sizeof(float) * f->c->n_embd);
}

static void row_attn_in(const fwd *f, int layer, int r) {
    const hk_layer *L = &f->m->layers[layer];
    const int n_embd = f->c->n_embd;
    float *h = f->h + (size_t)r * n_embd;
    block_input(f, f->x + (size_t)r * n_embd, L->attn_norm, h);
    hk_prepare_acts(f->isa, &f->acts, h, n_embd, hk_act_kinds(&L->wq, &L->wk, &L->wv), r);
    prefetch_kv_slots(f, layer, r);
}

/* Rotate x (head_dim) by the angles whose cos and sin are given (rope_dim / 2 of each). */
static void rope(float *x, const float *cs, const float *sn, int half, int neox) {
    if (neox) {
        for (int i = 0; i < half; i++) {
            float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * cs[i] - x2 * sn[i];
            x[i + half] = x2 * cs[i] + x1 * sn[i];
        }
    } else {
        for (int i = 0; i < half; i++) {
            float x1 = x[2 * i], x2 = x[2 * i + 1];
            x[2 * i] = x1 * cs[i] - x2 * sn[i];
            x[2 * i + 1] = x2 * cs[i] + x1 * sn[i];
        }
    }
}

/* The queries' temperature tuning at a position (llama.cpp's attention-scale input, mistral3's offset 0):
   1 when off. The division in float32, the logarithm in double, as llama.cpp. */
static float temperature(const hk_config *c, int pos) {
    if (c->attn_temp_floor <= 0 || c->attn_temp_scale == 0.0f) return 1.0f;
    return (float)(log(floor((float)pos / (float)c->attn_temp_floor) + 1.0) * c->attn_temp_scale + 1.0);
}

/* q/k norms (per head, or of the whole projection), RoPE of one head of this layer's set (none when -1). */
static void head_norm_rope(const fwd *f, const hk_layer *L, const float *norm, float *x, int r) {
    const hk_config *c = f->c;
    const int half = c->rope_dim / 2, d = c->head_dim;
    if (norm && !c->qk_norm_whole) rms_norm(f, x, norm, x, d);
    if (L->rope_set < 0) return;
    const size_t at = ((size_t)r * c->n_rope_sets + L->rope_set) * half;
    rope(x, f->rope_cos + at, f->rope_sin + at, half, c->rope_neox);
}

/* Biases, q/k norms, RoPE, the temperature and the attention scale; then this row's keys and values go into
   its cache. */
static void row_qkv_post(const fwd *f, int layer, int r) {
    const hk_config *c = f->c;
    const hk_layer *L = &f->m->layers[layer];
    const int nq = c->n_heads * c->head_dim, nk = c->n_kv_heads * c->head_dim, nv = c->n_kv_heads * c->v_head_dim;
    const int d = c->head_dim;
    float *q = f->q + (size_t)r * nq, *k = f->k + (size_t)r * nk, *v = f->v + (size_t)r * nv;
    if (L->bq) {
        add_into(q, L->bq, nq);
        add_into(k, L->bk, nk);
        add_into(v, L->bv, nv);
    }
    if (L->q_norm && c->qk_norm_whole) {
        rms_norm(f, q, L->q_norm, q, nq);
        rms_norm(f, k, L->k_norm, k, nk);
    }
    for (int h = 0; h < c->n_heads; h++) head_norm_rope(f, L, L->q_norm, q + h * d, r);
    float temp = temperature(c, f->row_pos[r]);
    if (temp != 1.0f) f->vo->scale(q, nq, temp);
    f->vo->scale(q, nq, c->attn_scale);
    const hk_seq *s = &f->seqs[f->row_seq[r]];
    hk_kv_rotate_queries(c, s, q);
    for (int h = 0; h < c->n_kv_heads; h++) {
        head_norm_rope(f, L, L->k_norm, k + h * d, r);
        size_t at = kv_slot(f, s, layer, h, r);
        hk_kv_store(f->vo, s, at, k + h * d, d, v + (size_t)h * c->v_head_dim, c->v_head_dim);
    }
}

static void row_attn_out(const fwd *f, int layer, int r) {
    const int width = f->c->n_heads * f->c->v_head_dim;
    const hk_layer *L = &f->m->layers[layer];
    hk_att a = f->att;
    a.layer = layer;
    a.window = L->window;
    hk_attention_merge_row(&a, r);
    hk_kv_rotate_output(f->c, &f->seqs[f->row_seq[r]], f->att_out + (size_t)r * width);
    hk_prepare_acts(f->isa, &f->acts, f->att_out + (size_t)r * width, width, hk_act_kinds(&L->wo, NULL, NULL), r);
}

/* x += the block's output o, post-normed and scaled as the architecture asks. */
static void residual_add(const fwd *f, float *x, float *o, const float *post_norm) {
    const int n_embd = f->c->n_embd;
    if (post_norm) rms_norm(f, o, post_norm, o, n_embd);
    if (f->c->residual_scale != 1.0f) f->vo->scale(o, n_embd, f->c->residual_scale);
    add_into(x, o, n_embd);
}

static int has_experts(const fwd *f, int layer) { return layer < f->c->n_layers && f->m->layers[layer].router.data; }

static void row_ffn_in(const fwd *f, int layer, int r) {
    const hk_layer *L = &f->m->layers[layer];
    const int n_embd = f->c->n_embd;
    float *x = f->x + (size_t)r * n_embd, *o = f->o + (size_t)r * n_embd, *h = f->h + (size_t)r * n_embd;
    if (L->bo) add_into(o, L->bo, n_embd);
    residual_add(f, x, o, L->post_attn_norm);
    block_input(f, x, L->ffn_norm, h);
    if (has_experts(f, layer))
        hk_moe_route_row(&f->moe, layer, h, r);
    else
        hk_prepare_acts(f->isa, &f->acts, h, n_embd, hk_act_kinds(&L->gate, &L->up, NULL), r);
}

static void row_down_in(const fwd *f, int layer, int r) {
    const hk_layer *L = &f->m->layers[layer];
    if (has_experts(f, layer)) {
        hk_moe_down_in_row(&f->moe, layer, r, f->g + (size_t)r * f->c->n_ff);
        return;
    }
    hk_prepare_acts(f->isa, &f->acts, f->g + (size_t)r * f->c->n_ff, f->c->n_ff, hk_act_kinds(&L->down, NULL, NULL), r);
}

static void row_ffn_out(const fwd *f, int layer, int r) {
    const int n_embd = f->c->n_embd;
    const float *shared = f->m->layers[layer].down.data ? f->h + (size_t)r * n_embd : NULL;
    if (has_experts(f, layer)) hk_moe_out_row(&f->moe, layer, r, f->o + (size_t)r * n_embd, shared);
    residual_add(f, f->x + (size_t)r * n_embd, f->o + (size_t)r * n_embd, f->m->layers[layer].post_ffn_norm);
}

/* Output row i (of the rows that want logits): final norm of its hidden state, quantized for the output. */
static void row_output_in(const fwd *f, int layer, int i) {
    const int n_embd = f->c->n_embd;
    float *h = f->h + (size_t)i * n_embd;
    rms_norm(f, f->x + (size_t)f->out_rows[i] * n_embd, f->m->output_norm, h, n_embd);
    hk_prepare_acts(f->isa, &f->acts, h, n_embd, hk_act_kinds(&f->m->output, NULL, NULL), i);
}

/* Output row i's logits: the logit scale, then the final softcap. */
static void row_output_post(const fwd *f, int layer, int i) {
    const hk_config *c = f->c;
    float *logits = f->logits + (size_t)i * c->n_vocab;
    (void)layer;
    if (c->logit_scale != 1.0f) f->vo->scale(logits, c->n_vocab, c->logit_scale);
    if (c->final_softcap > 0.0f) hk_softcap(logits, c->n_vocab, c->final_softcap);
}

typedef void (*row_fn)(const fwd *f, int layer, int r);

static row_fn row_function(int kind) {
    switch (kind) {
    case PH_EMBED: return row_embed;
    case PH_ATTN_IN: return row_attn_in;
    case PH_QKV_POST: return row_qkv_post;
    case PH_ATTN_OUT: return row_attn_out;
    case PH_FFN_IN: return row_ffn_in;
    case PH_DOWN_IN: return row_down_in;
    case PH_FFN_OUT: return row_ffn_out;
    case PH_OUT_IN: return row_output_in;
    case PH_OUT_POST: return row_output_post;
    default: return NULL;
    }
}

/* -- phases */

static void phase_of(const fwd *f, int p, int *kind, int *layer) {
    const int n_layer_phases = LAYER_PHASES * f->c->n_layers;
    if (p == 0) {
        *kind = PH_EMBED, *layer = 0;
    } else if (p <= n_layer_phases) {
        *kind = PH_ATTN_IN + (p - 1) % LAYER_PHASES, *layer = (p - 1) / LAYER_PHASES;
    } else {
        *kind = PH_OUT_IN + (p - 1 - n_layer_phases), *layer = f->c->n_layers;
    }
}

static int attention_plan_index(const fwd *f, int layer) { return f->m->layers[layer].window ? 1 : 0; }

/* A layer with experts: the units of its shared expert's product in this phase (none without one). */
static int shared_units(const fwd *f, int kind, int layer) {
    if (!f->m->layers[layer].gate.data) return 0;
    hk_product prod;
    product_of(f, kind, layer, &prod);
    return prod.n_units;
}

static void shared_unit(const fwd *f, int kind, int layer, int unit) {
    hk_product prod;
    product_of(f, kind, layer, &prod);
    hk_product_unit(&prod, unit);
}

/* Units of every phase, counted once by the caller before the job starts. */
static void count_units(fwd *f) {
    for (int p = 0; p < f->n_phases; p++) {
        int kind, layer;
        phase_of(f, p, &kind, &layer);
        int rows = kind >= PH_OUT_IN ? f->n_out : f->n;
        if (kind == PH_MOE_GROUP) {
            f->phase_units[p] = has_experts(f, layer);
        } else if (has_experts(f, layer) && (kind == PH_GLU || kind == PH_DOWN)) {
            f->phase_units[p] = hk_moe_units(&f->moe, layer, kind == PH_DOWN) + shared_units(f, kind, layer);
        } else if (row_function(kind)) {
            f->phase_units[p] = (rows + f->rows_per_unit - 1) / f->rows_per_unit;
        } else if (kind == PH_ATTEND) {
            f->phase_units[p] = f->n_att_tasks[attention_plan_index(f, layer)];
        } else {
            hk_product prod;
            product_of(f, kind, layer, &prod);
            f->phase_units[p] = prod.n_units;
        }
    }
}

static void run_units(const fwd *f, int p, atomic_int *claimed, atomic_int *done) {
    int kind, layer, u, n_units = f->phase_units[p];
    phase_of(f, p, &kind, &layer);
    row_fn fn = row_function(kind);
    if (kind == PH_MOE_GROUP || (has_experts(f, layer) && (kind == PH_GLU || kind == PH_DOWN))) {
        const int moe_units = kind == PH_MOE_GROUP ? 1 : hk_moe_units(&f->moe, layer, kind == PH_DOWN);
        while ((u = atomic_fetch_add_explicit(claimed, 1, memory_order_relaxed)) < n_units) {
            if (kind == PH_MOE_GROUP)
                hk_moe_group(&f->moe, layer);
            else if (u < moe_units)
                hk_moe_unit(&f->moe, layer, kind == PH_DOWN, u);
            else
                shared_unit(f, kind, layer, u - moe_units);
            atomic_fetch_add_explicit(done, 1, memory_order_release);
        }
    } else if (fn) {
        int rows = kind >= PH_OUT_IN ? f->n_out : f->n;
        while ((u = atomic_fetch_add_explicit(claimed, 1, memory_order_relaxed)) < n_units) {
            for (int r = u * f->rows_per_unit, end = imin(rows, r + f->rows_per_unit); r < end; r++) fn(f, layer, r);
            atomic_fetch_add_explicit(done, 1, memory_order_release);
        }
    } else if (kind == PH_ATTEND) {
        hk_att a = f->att;
        a.layer = layer;
        a.window = f->m->layers[layer].window;
        a.tasks = f->att_tasks[attention_plan_index(f, layer)];
        const int stride = hk_pool_threads(); /* with tasks of like size, the one this thread likely runs next */
        while ((u = atomic_fetch_add_explicit(claimed, 1, memory_order_relaxed)) < n_units) {
            if (u + stride < n_units) hk_attention_prefetch(&a, u + stride);
            hk_attention_task(&a, u);
            atomic_fetch_add_explicit(done, 1, memory_order_release);
        }
    } else {
        hk_product prod;
        product_of(f, kind, layer, &prod);
        while ((u = atomic_fetch_add_explicit(claimed, 1, memory_order_relaxed)) < n_units) {
            hk_product_unit(&prod, u);
            atomic_fetch_add_explicit(done, 1, memory_order_release);
        }
    }
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* One participant: every phase in order, claiming units, then waiting for the units others claimed. */
static void walk_phases(void *ctx, int participant) {
    const fwd *f = ctx;
    (void)participant;
    for (int p = 0; p < f->n_phases; p++) {
        atomic_int *claimed = &f->phase_sync[2 * p], *done = claimed + 1;
        run_units(f, p, claimed, done);
        for (int spins = 0; atomic_load_explicit(done, memory_order_acquire) < f->phase_units[p]; spins++) {
            cpu_relax();
            if (spins % YIELD_EVERY == YIELD_EVERY - 1) sched_yield(); /* the thread we wait for may want this core */
        }
    }
}

static int check_call(const hk_model *m, const int32_t *tokens, const hk_seq *seqs, int n_seqs, int *n_rows) {
    int n = 0;
    if (n_seqs < 1) return -3;
    for (int s = 0; s < n_seqs; s++) {
        const hk_seq *q = &seqs[s];
        if (q->n_rows < 1 || q->n_past < 0 || q->n_past > q->capacity - q->n_rows || n > m->c.max_rows - q->n_rows) return -3;
        n += q->n_rows;
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->c.n_vocab) return -2;
    *n_rows = n;
    return 0;
}

/* Rows, their positions, the rows that want logits, the attention plans and the phase table. */
static void plan_call(fwd *f, int logits_mode) {
    hk_model *m = f->m;
    for (int s = 0, r = 0; s < f->n_seqs; s++)
        for (int i = 0; i < f->seqs[s].n_rows; i++, r++) {
            f->row_seq[r] = s;
            f->row_pos[r] = f->seqs[s].n_past + i;
        }
    f->n_out = logits_mode == HK_LOGITS_ALL ? f->n : logits_mode == HK_LOGITS_LAST ? f->n_seqs : 0;
    for (int i = 0, r = 0; i < f->n_out; i++) {
        r = logits_mode == HK_LOGITS_ALL ? i : r + f->seqs[i].n_rows;
        f->out_rows[i] = logits_mode == HK_LOGITS_ALL ? i : r - 1;
    }
    hk_attention_layout(m, f->seqs, f->n_seqs, f->row_slot);
    f->att = (hk_att){.m = m, .vo = f->vo, .seqs = f->seqs, .row_seq = f->row_seq, .row_pos = f->row_pos, .q = f->q,
                      .att = f->att_out, .row_slot = f->row_slot,
                      .partial = (float *)(void *)((uint8_t *)m->arena.att_mem + m->arena.att_tasks_bytes)};
    f->att_tasks[0] = (hk_att_task *)m->arena.att_mem;
    f->att_tasks[1] = (hk_att_task *)(void *)((uint8_t *)m->arena.att_mem + m->arena.att_tasks_bytes / 2);
    f->n_att_tasks[0] = hk_attention_plan(m, f->seqs, f->n_seqs, f->row_pos, 0, f->att_tasks[0]);
    f->n_att_tasks[1] = 0;
    for (int l = 0; l < m->c.n_layers; l++)
        if (m->layers[l].window) {
            f->n_att_tasks[1] = hk_attention_plan(m, f->seqs, f->n_seqs, f->row_pos, m->layers[l].window, f->att_tasks[1]);
            break;
        }
    /* about four units per thread; down to one row each, so the rows of a small decode batch are shared out
       too (a row's work is the same on any thread) */
    f->rows_per_unit = imax(1, f->n / (hk_pool_threads() * 4));
    f->moe.m = m, f->moe.isa = f->isa, f->moe.vo = f->vo, f->moe.acts = &f->acts, f->moe.n = f->n;
    f->n_phases = 1 + LAYER_PHASES * m->c.n_layers + (f->n_out ? 2 + logits_post(&m->c) : 0);
    count_units(f);
    for (int i = 0; i < 2 * f->n_phases; i++) atomic_init(&f->phase_sync[i], 0);
}

int hk_model_forward(hk_model *m, const int32_t *tokens, const hk_seq *seqs, int n_seqs, float *logits, int logits_mode) {
    fwd F;
    memset(&F, 0, sizeof F);
    fwd *f = &F;
    int n, rc = check_call(m, tokens, seqs, n_seqs, &n);
    if (rc != 0) return rc;
    size_t partial_floats;
    int max_tasks;
    hk_attention_sizes(m, seqs, n_seqs, &partial_floats, &max_tasks);
    if (reserve_attention(m, partial_floats, max_tasks) != 0) return -1;
    layout(&m->c, m->arena.mem, f);
    f->m = m;
    f->c = &m->c;
    f->isa = hk_active_isa();
    f->vo = hk_vecops_active();
    f->seqs = seqs;
    f->n_seqs = n_seqs;
    f->tokens = tokens;
    f->n = n;
    f->logits = logits;
    plan_call(f, logits_mode);
    hk_pool_run(walk_phases, f, hk_pool_threads());
    return 0;
}
