/* The fused decoder's mixture-of-experts FFN (see moe.h). The same float32 operations as engine/moe.py where
   the order is ours to choose: softmax with the max subtracted, a stable top-k (the lower expert on a tie),
   the weighted sum in ascending expert order. */
#include "moe.h"

#include <math.h>
#include <string.h>

#include "matmul.h"
#include "pool.h"

#define MIN_WEIGHT_SUM 6.103515625e-5f /* llama.cpp clamps the renormalising sum here */
#define OAI_ALPHA 1.702f               /* ggml_swiglu_oai's constants */
#define OAI_LIMIT 7.0f

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }
static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

size_t hk_moe_layout(const hk_config *c, uint8_t *base, hk_moe *s) {
    if (c->n_expert < 1) return 0;
    size_t off = 0, R = (size_t)c->max_rows, K = (size_t)c->n_expert_used, P = R * K;
#define TAKE(field, type, count)                                        \
    do {                                                                \
        if (s) s->field = (type *)(void *)(base + off);                 \
        off += align64(sizeof(type) * (size_t)(count));                 \
    } while (0)
    TAKE(logits, float, R * c->n_expert);
    TAKE(choice, int, P);
    TAKE(weight, float, P);
    TAKE(pair_of, int, P);
    TAKE(pair_row, int, P);
    TAKE(start, int, c->n_expert + 1);
    TAKE(active, int, c->n_expert);
    TAKE(n_active, int, 1);
    for (int kind = 0; kind < HK_ACT_KINDS; kind++) {
        size_t stride = hk_act_bytes(kind, c->n_ff_exp);
        if (s) s->down_acts.stride[kind] = stride;
        TAKE(pair_acts[kind], hk_act, P);
        TAKE(down_acts.mem[kind], uint8_t, P * stride);
        TAKE(down_acts.acts[kind], hk_act, P);
    }
    TAKE(hidden, float, P * c->n_ff_exp);
    TAKE(up, float, P * c->n_ff_exp);
    TAKE(y, float, P * c->n_embd);
    TAKE(shexp_den, float, R);
#undef TAKE
    return off;
}

/* -- routing: one row */

static void softmax(float *x, int n) {
    float peak = x[0], sum = 0.0f;
    for (int i = 1; i < n; i++) peak = x[i] > peak ? x[i] : peak;
    for (int i = 0; i < n; i++) sum += x[i] = expf(x[i] - peak);
    for (int i = 0; i < n; i++) x[i] /= sum;
}

/* The k highest of score (n), highest first, the lower index first on a tie. */
static void top_k(const float *score, const float *bias, int n, int k, int *out) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        float best_score = 0.0f;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int i = 0; i < j && !taken; i++) taken = out[i] == e;
            float v = bias ? score[e] + bias[e] : score[e];
            if (!taken && (best < 0 || v > best_score)) best = e, best_score = v;
        }
        out[j] = best;
    }
}

void hk_moe_route_row(const hk_moe *s, int layer, const float *h, int r) {
    const hk_config *c = &s->m->c;
    const hk_layer *L = &s->m->layers[layer];
    const int E = c->n_expert, K = c->n_expert_used;
    hk_prepare_acts(s->isa, s->acts, h, c->n_embd, hk_act_kinds(&L->router, &L->gate_exps, &L->up_exps), r);
    if (L->gate.data) hk_prepare_acts(s->isa, s->acts, h, c->n_embd, hk_act_kinds(&L->gate, &L->up, NULL), r);
    if (L->shexp_gate) {
        float z = 0.0f;
        for (int i = 0; i < c->n_embd; i++) z += h[i] * L->shexp_gate[i];
        s->shexp_den[r] = 1.0f + expf(-z);
    }
    float *p = s->logits + (size_t)r * E, *w = s->weight + (size_t)r * K;
    int *chosen = s->choice + (size_t)r * K;
    const hk_act *a = &s->acts->acts[hk_type_info(L->router.type)->act][r];
    hk_dot_rows(s->isa, L->router.type, L->router.data, L->router.stride, 0, E, c->n_embd, a, 1, p, E);
    if (L->b_router)
        for (int e = 0; e < E; e++) p[e] += L->b_router[e];
    if (c->expert_gating == HK_GATING_SOFTMAX) softmax(p, E);
    if (c->expert_gating == HK_GATING_SIGMOID)
        for (int e = 0; e < E; e++) p[e] = 1.0f / (1.0f + expf(-p[e]));
    top_k(p, L->exp_probs_b, E, K, chosen);
    for (int j = 0; j < K; j++) w[j] = p[chosen[j]];
    if (c->expert_gating == HK_GATING_SOFTMAX_WEIGHT) softmax(w, K);
    if (c->expert_norm) {
        float sum = 0.0f;
        for (int j = 0; j < K; j++) sum += w[j];
        sum = sum > MIN_WEIGHT_SUM ? sum : MIN_WEIGHT_SUM;
        for (int j = 0; j < K; j++) w[j] /= sum;
    }
    if (c->expert_weights_scale != 0.0f && c->expert_weights_scale != 1.0f)
        for (int j = 0; j < K; j++) w[j] *= c->expert_weights_scale;
}

/* -- grouping: a counting sort of the call's (row, choice) pairs by expert */

void hk_moe_group(const hk_moe *s, int layer) {
    const hk_config *c = &s->m->c;
    const hk_layer *L = &s->m->layers[layer];
    const int E = c->n_expert, K = c->n_expert_used, P = s->n * K;
    memset(s->start, 0, sizeof(int) * (size_t)(E + 1));
    for (int i = 0; i < P; i++) s->start[s->choice[i] + 1]++;
    int n_active = 0;
    for (int e = 0; e < E; e++) {
        if (s->start[e + 1]) s->active[n_active++] = e;
        s->start[e + 1] += s->start[e];
    }
    *s->n_active = n_active;
    int next[HK_MAX_EXPERTS]; /* the next free pair of each expert */
    memcpy(next, s->start, sizeof(int) * (size_t)E);
    unsigned kinds = hk_act_kinds(&L->gate_exps, &L->up_exps, NULL);
    for (int r = 0; r < s->n; r++)
        for (int j = 0; j < K; j++) {
            int p = next[s->choice[r * K + j]]++;
            s->pair_of[r * K + j] = p;
            s->pair_row[p] = r;
            for (int kind = 0; kind < HK_ACT_KINDS; kind++)
                if (kinds & (1u << kind)) s->pair_acts[kind][p] = s->acts->acts[kind][r];
        }
}

/* -- the experts' products: units are (the i-th chosen expert, a row chunk of its matrix) */

static const hk_matrix *unit_matrix(const hk_layer *L, int down) { return down ? &L->down_exps : &L->gate_exps; }

/* The rows of one unit. While most chosen experts serve one token each (a decode step), a unit is a whole
   expert's matrix, or the share of it that gives every thread HK_UNITS_PER_THREAD units: against the row chunks
   dense products had then (eight a thread: 48-row units of Qwen3-30B-A3B's experts), decode ran 1.26x as fast
   on Qwen3-30B-A3B shapes and 1.10x on gpt-oss-20b's (2 threads, paired in one process). Otherwise the chunks
   of a dense product with that many tokens. */
static int unit_chunk(const hk_moe *s, const hk_matrix *w, int rows_per_expert, int down) {
    const hk_config *c = &s->m->c;
    const int slots = imin(c->n_expert, s->n * c->n_expert_used), pairs_per_expert = imax(1, s->n * c->n_expert_used / c->n_expert);
    (void)down;
    if (pairs_per_expert > 1)
        return imin(rows_per_expert, hk_chunk_rows(s->isa, w->type, rows_per_expert, pairs_per_expert, w->cols));
    const int per_expert = imax(1, (HK_UNITS_PER_THREAD * hk_pool_threads() + slots - 1) / slots);
    return imin(rows_per_expert, ((rows_per_expert + per_expert - 1) / per_expert + 15) / 16 * 16);
}

static int expert_rows(const hk_config *c, int down) { return down ? c->n_embd : c->n_ff_exp; }

int hk_moe_units(const hk_moe *s, int layer, int down) {
    const hk_config *c = &s->m->c;
    const int rows = expert_rows(c, down), chunk = unit_chunk(s, unit_matrix(&s->m->layers[layer], down), rows, down);
    return imin(c->n_expert, s->n * c->n_expert_used) * ((rows + chunk - 1) / chunk);
}

/* gpt-oss: x = min(gate, 7), y = clamp(up, -7, 7), x * sigmoid(1.702 x) * (y + 1) */
static void swiglu_oai(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) {
        float x = g[i] < OAI_LIMIT ? g[i] : OAI_LIMIT, y = u[i] < -OAI_LIMIT ? -OAI_LIMIT : u[i] > OAI_LIMIT ? OAI_LIMIT : u[i];
        g[i] = x / (1.0f + expf(-OAI_ALPHA * x)) * (y + 1.0f);
    }
}

static void expert_rows_product(const hk_moe *s, const hk_matrix *w, int e, int rows_per_expert, int r0, int r1,
                                const hk_act *acts, int n_pairs, float *out) {
    const uint8_t *first = w->data + (ptrdiff_t)e * rows_per_expert * w->stride;
    hk_dot_rows(s->isa, w->type, first, w->stride, r0, r1, w->cols, acts, n_pairs, out, rows_per_expert);
}

static void gate_up_unit(const hk_moe *s, const hk_layer *L, int e, int r0, int r1) {
    const hk_config *c = &s->m->c;
    const int ff = c->n_ff_exp, p0 = s->start[e], np = s->start[e + 1] - p0;
    float *g = s->hidden + (size_t)p0 * ff, *u = s->up + (size_t)p0 * ff;
    expert_rows_product(s, &L->gate_exps, e, ff, r0, r1, s->pair_acts[hk_type_info(L->gate_exps.type)->act] + p0, np, g);
    expert_rows_product(s, &L->up_exps, e, ff, r0, r1, s->pair_acts[hk_type_info(L->up_exps.type)->act] + p0, np, u);
    for (int t = 0; t < np; t++) {
        float *gt = g + (size_t)t * ff + r0, *ut = u + (size_t)t * ff + r0;
        if (L->b_gate_exps)
            for (int i = 0; i < r1 - r0; i++) {
                gt[i] += L->b_gate_exps[(size_t)e * ff + r0 + i];
                ut[i] += L->b_up_exps[(size_t)e * ff + r0 + i];
            }
        if (c->gelu == HK_ACT_SWIGLU_OAI)
            swiglu_oai(gt, ut, r1 - r0);
        else
            s->vo->glu(gt, ut, r1 - r0, c->gelu);
    }
}

void hk_moe_unit(const hk_moe *s, int layer, int down, int unit) {
    const hk_config *c = &s->m->c;
    const hk_layer *L = &s->m->layers[layer];
    const int rows = expert_rows(c, down), chunk = unit_chunk(s, unit_matrix(L, down), rows, down);
    const int n_chunks = (rows + chunk - 1) / chunk, i = unit / n_chunks, r0 = unit % n_chunks * chunk;
    if (i >= *s->n_active) return;
    const int e = s->active[i], r1 = imin(rows, r0 + chunk);
    if (!down) {
        gate_up_unit(s, L, e, r0, r1);
        return;
    }
    const int p0 = s->start[e], np = s->start[e + 1] - p0;
    const hk_act *acts = s->down_acts.acts[hk_type_info(L->down_exps.type)->act] + p0;
    expert_rows_product(s, &L->down_exps, e, c->n_embd, r0, r1, acts, np, s->y + (size_t)p0 * c->n_embd);
}

void hk_moe_down_in_row(const hk_moe *s, int layer, int r, const float *g) {
    const hk_config *c = &s->m->c;
    const hk_layer *L = &s->m->layers[layer];
    const unsigned kinds = hk_act_kinds(&L->down_exps, NULL, NULL);
    if (L->down.data) hk_prepare_acts(s->isa, s->acts, g, c->n_ff, hk_act_kinds(&L->down, NULL, NULL), r);
    for (int j = 0; j < c->n_expert_used; j++) {
        int p = s->pair_of[r * c->n_expert_used + j];
        hk_prepare_acts(s->isa, &s->down_acts, s->hidden + (size_t)p * c->n_ff_exp, c->n_ff_exp, kinds, p);
    }
}

void hk_moe_out_row(const hk_moe *s, int layer, int r, float *o, const float *shared) {
    const hk_config *c = &s->m->c;
    const hk_layer *L = &s->m->layers[layer];
    const int K = c->n_expert_used, d = c->n_embd;
    int order[64], k = 0; /* this row's choices in ascending expert order (n_expert_used <= 64) */
    for (int j = 0; j < K; j++) {
        int i = k++;
        while (i > 0 && s->choice[r * K + order[i - 1]] > s->choice[r * K + j]) order[i] = order[i - 1], i--;
        order[i] = j;
    }
    memset(o, 0, sizeof(float) * (size_t)d);
    for (int i = 0; i < K; i++) {
        const int j = order[i], e = s->choice[r * K + j];
        const float w = s->weight[r * K + j], *y = s->y + (size_t)s->pair_of[r * K + j] * d;
        const float *b = L->b_down_exps ? L->b_down_exps + (size_t)e * d : NULL;
        for (int x = 0; x < d; x++) o[x] += (b ? y[x] + b[x] : y[x]) * w;
    }
    if (!shared) return;
    const float den = L->shexp_gate ? s->shexp_den[r] : 1.0f;
    for (int x = 0; x < d; x++) o[x] += shared[x] / den;
}
