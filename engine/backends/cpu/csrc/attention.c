/* Attention over the KV caches in online-softmax blocks.

   Every row takes the same path to its result whether it is a decode step or one row of a prefill chunk:
   its keys are cut into chunks at multiples of HK_ATT_CHUNK and blocks at multiples of the block size; each
   chunk's softmax state (max m, sum l, unnormalized output O) is built block by block, and the chunk states
   are merged in key order. A decode row runs its chunks as parallel tasks and merges afterwards; prefill rows
   run chunk after chunk in one task. Same operations in the same order: a speculative verify pass then gives
   each row bit for bit the logits of a decode step. */
#include "attention.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define ROWS_PER_TASK 16     /* prefill rows per task, all heads of one kv head: they share each key block */
#define KV_BUF_FLOATS 16384  /* a float16 key block and value block converted, where they are not read in place */
#define DECODE_SLOT(dv) ((size_t)(dv) + 2)  /* m, l, O[dv] */
#define PREFILL_SLOT(dv) ((size_t)(dv) + 4) /* m, l, O[dv] of the chunk, then M, L of the row */
#define NEXT_TASK_BYTES 4096 /* keys (and values) of a decode task asked for a task early: the products' own
                                prefetch runs this far ahead of them, so a task's first keys would come cold */

/* Keys per block: a power of two (so chunks are whole blocks) whose K and V blocks fit KV_BUF_FLOATS. */
static int block_keys(const hk_config *c) {
    int bk = 64;
    while (bk > 1 && bk * (c->head_dim + c->v_head_dim) > KV_BUF_FLOATS) bk /= 2;
    return bk;
}

static int lowest_key(int pos, int window) { return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0; }
static int imax(int a, int b) { return a > b ? a : b; }
static int imin(int a, int b) { return a < b ? a : b; }

/* A head's softmax denominator: the keys' sum L (relative to their max M), plus the layer's sink if it has one. */
static float denominator(const hk_att *a, int h, float M, float L) {
    const float *sinks = a->m->layers[a->layer].sinks;
    return sinks ? L + expf(sinks[h] - M) : L;
}

void hk_attention_sizes(const hk_model *m, const hk_seq *seqs, int n_seqs, size_t *partial_floats, int *max_tasks) {
    const hk_config *c = &m->c;
    size_t floats = 0;
    int tasks = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (seqs[s].n_rows == 1) {
            int chunks = seqs[s].n_past / HK_ATT_CHUNK + 1;
            floats += (size_t)c->n_heads * chunks * DECODE_SLOT(c->v_head_dim);
            tasks += c->n_kv_heads * chunks;
        } else {
            floats += (size_t)seqs[s].n_rows * c->n_heads * PREFILL_SLOT(c->v_head_dim);
            tasks += c->n_kv_heads * ((seqs[s].n_rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
        }
    }
    *partial_floats = floats;
    *max_tasks = tasks;
}

void hk_attention_layout(const hk_model *m, const hk_seq *seqs, int n_seqs, size_t *row_slot) {
    const hk_config *c = &m->c;
    size_t off = 0;
    for (int s = 0, row = 0; s < n_seqs; s++) {
        for (int i = 0; i < seqs[s].n_rows; i++, row++) {
            row_slot[row] = off;
            if (seqs[s].n_rows == 1)
                off += (size_t)c->n_heads * (seqs[s].n_past / HK_ATT_CHUNK + 1) * DECODE_SLOT(c->v_head_dim);
            else
                off += (size_t)c->n_heads * PREFILL_SLOT(c->v_head_dim);
        }
    }
}

/* Keys and values [j0, j1) of one kv head as the products read them: k and v point at key j0 and value j0,
   float16 (f16) or float32. A float16 cache is read in place where the vector table has float16 products,
   else converted into buf (room for the block's keys, then its values); a q8_0 cache is always converted. */
typedef struct {
    const void *k, *v;
    int f16;
} kv_span;

static kv_span kv_block(const hk_att *a, const hk_seq *s, int kvh, int j0, int j1, float *buf) {
    const hk_config *c = &a->m->c;
    const int d = c->head_dim, dv = c->v_head_dim, n = j1 - j0;
    const size_t row = ((size_t)a->layer * c->n_kv_heads + kvh) * s->capacity + j0;
    const uint8_t *k = (const uint8_t *)s->k + row * hk_kv_row_bytes(s->kv_type, d);
    const uint8_t *v = (const uint8_t *)s->v + row * hk_kv_row_bytes(s->kv_type, dv);
    if (s->kv_type == HK_KV_F32) return (kv_span){k, v, 0};
    if (s->kv_type == HK_KV_F16 && a->vo->scores_f16 && a->vo->pv_f16) return (kv_span){k, v, 1};
    float *vbuf = buf + (size_t)n * d;
    if (s->kv_type == HK_KV_F16) {
        a->vo->f16_to_f32((const uint16_t *)k, buf, n * d);
        a->vo->f16_to_f32((const uint16_t *)v, vbuf, n * dv);
    } else { /* the block's rows are whole q8_0 blocks, back to back */
        a->vo->q8_0_to_f32(k, buf, n * d / 32);
        a->vo->q8_0_to_f32(v, vbuf, n * dv / 32);
    }
    return (kv_span){buf, vbuf, 0};
}

/* x (n, a multiple of 32) as q8_0 blocks, as llama.cpp quantizes them: d = max |x| / 127, codes x / d
   rounded to nearest (ties to even, as its x86 code), d stored as float16. */
static void quantize_q8_0(const float *x, uint8_t *y, int n) {
    for (int b = 0; b < n / 32; b++, x += 32, y += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = hk_f32_to_f16(d);
        memcpy(y, &h, 2);
        for (int j = 0; j < 32; j++) y[2 + j] = (uint8_t)(int8_t)lrintf(x[j] * id);
    }
}

/* The rotations of a q8_0 cache, as llama.cpp's (attn_rot_k, attn_rot_v): an orthonormal Walsh-Hadamard
   transform of every run of n elements spreads a few outlier channels (Qwen2's keys reach 150 where most are
   under 10) over a whole q8_0 block. Keys and queries turn alike (the scores stay the same), keys by the largest
   power of two from 64 that divides the head; values by 64, and the attention output turns back (H H = I).
   0: no rotation (a head not a multiple of 64). */
static int rotation_k(int d) {
    if (d % 64) return 0;
    int n = 64;
    while (d % (2 * n) == 0) n *= 2;
    return n;
}
static int rotation_v(int dv) { return dv % 64 ? 0 : 64; }

/* x (len, a multiple of n) = H_n x in every run of n: Sylvester's Hadamard matrix over sqrt(n). */
static void hadamard(float *x, int len, int n) {
    const float scale = 1.0f / sqrtf((float)n);
    for (float *r = x; r < x + len; r += n) {
        for (int h = 1; h < n; h *= 2)
            for (int i = 0; i < n; i += 2 * h)
                for (int j = i; j < i + h; j++) {
                    float a = r[j], b = r[j + h];
                    r[j] = a + b;
                    r[j + h] = a - b;
                }
        for (int j = 0; j < n; j++) r[j] *= scale;
    }
}

void hk_kv_rotate_queries(const hk_config *c, const hk_seq *s, float *q) {
    if (s->kv_type == HK_KV_Q8_0 && rotation_k(c->head_dim)) hadamard(q, c->n_heads * c->head_dim, rotation_k(c->head_dim));
}

void hk_kv_rotate_output(const hk_config *c, const hk_seq *s, float *o) {
    if (s->kv_type == HK_KV_Q8_0 && rotation_v(c->v_head_dim)) hadamard(o, c->n_heads * c->v_head_dim, rotation_v(c->v_head_dim));
}

/* x (n) rotated (rot > 0) into tmp and quantized as q8_0 into y. */
static void store_q8_0(const float *x, int n, int rot, float *tmp, uint8_t *y) {
    if (rot) {
        memcpy(tmp, x, sizeof(float) * n);
        hadamard(tmp, n, rot);
        x = tmp;
    }
    quantize_q8_0(x, y, n);
}

void hk_kv_store(const hk_vecops *vo, const hk_seq *s, size_t slot, const float *k, int d, const float *v, int dv) {
    uint8_t *kp = (uint8_t *)s->k + slot * hk_kv_row_bytes(s->kv_type, d);
    uint8_t *vp = (uint8_t *)s->v + slot * hk_kv_row_bytes(s->kv_type, dv);
    switch (s->kv_type) {
    case HK_KV_F16:
        vo->f32_to_f16(k, (uint16_t *)(void *)kp, d);
        vo->f32_to_f16(v, (uint16_t *)(void *)vp, dv);
        break;
    case HK_KV_Q8_0: {
        float tmp[KV_BUF_FLOATS]; /* head_dim + v_head_dim <= 16384 (hk_model_init) */
        store_q8_0(k, d, rotation_k(d), tmp, kp);
        store_q8_0(v, dv, rotation_v(dv), tmp, vp);
        break;
    }
    default:
        memcpy(kp, k, sizeof(float) * d);
        memcpy(vp, v, sizeof(float) * dv);
    }
}

/* The span from key i of kv on (i < the block's length). */
static kv_span kv_from(kv_span kv, int i, int d, int dv) {
    size_t es = kv.f16 ? 2 : 4;
    return (kv_span){(const char *)kv.k + (size_t)i * d * es, (const char *)kv.v + (size_t)i * dv * es, kv.f16};
}

/* Ask for keys (which 0) or values (1) [j0, j1) of kv head kvh ahead of their use: a decode row reads each
   sequence's cache once per layer, from memory, and the hardware prefetcher starts late on every new block.
   near: into L1 for use now, else into L2 for use a task later. */
static inline void prefetch_kv(const hk_att *a, const hk_seq *s, int kvh, int which, int j0, int j1, const int near) {
    const hk_config *c = &a->m->c;
    const size_t rb = hk_kv_row_bytes(s->kv_type, which ? c->v_head_dim : c->head_dim);
    const char *p = (const char *)(which ? s->v : s->k) + (((size_t)a->layer * c->n_kv_heads + kvh) * s->capacity + j0) * rb;
    for (size_t off = 0, n = (size_t)(j1 - j0) * rb; off < n; off += 64) {
        if (near)
            __builtin_prefetch(p + off, 0, 3);
        else
            __builtin_prefetch(p + off, 0, 2);
    }
}

#define HEADS_PER_PASS 16 /* query heads of one kv head folded together (their scores on the stack) */

/* Fold n keys into the online-softmax states of nr <= HEADS_PER_PASS query heads of one position: head i's
   query at q + i * d, its state (m, l, O[dv]) at st + i * stride. The rows share every key and value load;
   each row's arithmetic is what it would be alone. softcap > 0: scores become softcap * tanh(score / softcap). */
static void update(const hk_vecops *vo, const float *q, int nr, kv_span kv, int n, int d, int dv, float *st, size_t stride,
                   float softcap) {
    float s[HEADS_PER_PASS * 64];
    if (kv.f16)
        vo->scores_f16(q, d, nr, kv.k, d, n, s, 64);
    else
        vo->scores(q, d, nr, kv.k, d, n, s, 64);
    for (int i = 0; i < nr; i++) {
        float *m = st + i * stride, *l = m + 1, *si = s + i * 64;
        if (softcap > 0.0f) hk_softcap(si, n, softcap);
        float mb = vo->max(si, n);
        if (mb > *m) {
            if (*l > 0.0f) {
                float shrink = expf(*m - mb);
                *l *= shrink;
                vo->scale(m + 2, dv, shrink);
            }
            *m = mb;
        }
        *l += vo->exp_sum(si, n, *m);
    }
    if (kv.f16)
        vo->pv_f16(s, 64, nr, kv.v, dv, n, st + 2, (int)stride);
    else
        vo->pv(s, 64, nr, kv.v, dv, n, st + 2, (int)stride);
}

/* update() for all the query heads [h0, h1) of one kv head, HEADS_PER_PASS at a time. */
static void update_heads(const hk_att *a, int r, int h0, int h1, kv_span kv, int n, float *st, size_t stride) {
    const hk_config *c = &a->m->c;
    for (int h = h0; h < h1; h += HEADS_PER_PASS) {
        int nr = h1 - h < HEADS_PER_PASS ? h1 - h : HEADS_PER_PASS;
        update(a->vo, a->q + ((size_t)r * c->n_heads + h) * c->head_dim, nr, kv, n, c->head_dim, c->v_head_dim,
               st + (size_t)(h - h0) * stride, stride, c->attn_softcap);
    }
}

/* Merge a chunk's state (mc, lc, oc) into a row's running state (M, L, O). */
static void merge(const hk_vecops *vo, float *M, float *L, float *o, float mc, float lc, const float *oc, int dv) {
    if (*M == -INFINITY) {
        *M = mc;
        *L = lc;
        memcpy(o, oc, sizeof(float) * dv);
        return;
    }
    float mn = mc > *M ? mc : *M, a = expf(*M - mn), b = expf(mc - mn);
    *L = *L * a + lc * b;
    vo->axpby(o, a, oc, b, dv);
    *M = mn;
}

/* The keys [start, end) of decode task t: its chunk, cut to the row's window and position. */
static void decode_keys(const hk_att *a, const hk_att_task *t, int *start, int *end) {
    const int p = a->row_pos[t->row0];
    *start = imax(lowest_key(p, a->window), t->chunk * HK_ATT_CHUNK);
    *end = imin(p + 1, (t->chunk + 1) * HK_ATT_CHUNK);
}

static void decode_task(const hk_att *a, const hk_att_task *t) {
    const hk_config *c = &a->m->c;
    const hk_seq *s = &a->seqs[t->seq];
    const int dv = c->v_head_dim, group = c->n_heads / c->n_kv_heads, bk = block_keys(c);
    const int r = t->row0, p = a->row_pos[r], nch = p / HK_ATT_CHUNK + 1;
    int start, end;
    decode_keys(a, t, &start, &end);
    float buf[KV_BUF_FLOATS];
    for (int h = t->kvh * group; h < (t->kvh + 1) * group; h++) {
        float *st = a->partial + a->row_slot[r] + ((size_t)h * nch + t->chunk) * DECODE_SLOT(dv);
        st[0] = -INFINITY;
        st[1] = 0.0f;
        memset(st + 2, 0, sizeof(float) * dv);
    }
    for (int j0 = start / bk * bk; j0 < end; j0 += bk) {
        int ka = imax(j0, start), kb = imin(j0 + bk, end);
        if (j0 == start / bk * bk) { /* the first block; the products ask for the rest as they go */
            prefetch_kv(a, s, t->kvh, 0, ka, kb, 1);
            prefetch_kv(a, s, t->kvh, 1, ka, kb, 1);
        }
        kv_span kv = kv_block(a, s, t->kvh, ka, kb, buf);
        float *st = a->partial + a->row_slot[r] + ((size_t)t->kvh * group * nch + t->chunk) * DECODE_SLOT(dv);
        update_heads(a, r, t->kvh * group, (t->kvh + 1) * group, kv, kb - ka, st, (size_t)nch * DECODE_SLOT(dv));
    }
}

static void prefill_task(const hk_att *a, const hk_att_task *t) {
    const hk_config *c = &a->m->c;
    const hk_seq *s = &a->seqs[t->seq];
    const int d = c->head_dim, dv = c->v_head_dim, group = c->n_heads / c->n_kv_heads, bk = block_keys(c);
    const int h0 = t->kvh * group, h1 = h0 + group;
    const int lo_first = lowest_key(a->row_pos[t->row0], a->window), p_last = a->row_pos[t->row1 - 1];
    float buf[KV_BUF_FLOATS];
#define SLOT(r, h) (a->partial + a->row_slot[r] + (size_t)(h) * PREFILL_SLOT(dv))
#define OUT(r, h) (a->att + ((size_t)(r) * c->n_heads + (h)) * dv)
    for (int r = t->row0; r < t->row1; r++)
        for (int h = h0; h < h1; h++) {
            SLOT(r, h)[dv + 2] = -INFINITY;
            SLOT(r, h)[dv + 3] = 0.0f;
        }
    for (int ch = lo_first / HK_ATT_CHUNK; ch <= p_last / HK_ATT_CHUNK; ch++) {
        const int cs = imax(lo_first, ch * HK_ATT_CHUNK), ce = imin(p_last + 1, (ch + 1) * HK_ATT_CHUNK);
        for (int r = t->row0; r < t->row1; r++)
            for (int h = h0; h < h1; h++) {
                float *st = SLOT(r, h);
                st[0] = -INFINITY;
                st[1] = 0.0f;
                memset(st + 2, 0, sizeof(float) * dv);
            }
        for (int j0 = cs / bk * bk; j0 < ce; j0 += bk) {
            int ka = imax(j0, cs), kb = imin(j0 + bk, ce);
            kv_span kv = kv_block(a, s, t->kvh, ka, kb, buf);
            for (int r = t->row0; r < t->row1; r++) {
                int p = a->row_pos[r], ra = imax(j0, lowest_key(p, a->window)), rb = imin(j0 + bk, p + 1);
                if (ra >= rb) continue;
                update_heads(a, r, h0, h1, kv_from(kv, ra - ka, d, dv), rb - ra, SLOT(r, h0), PREFILL_SLOT(dv));
            }
        }
        for (int r = t->row0; r < t->row1; r++)
            for (int h = h0; h < h1; h++) {
                float *st = SLOT(r, h);
                if (st[0] != -INFINITY) merge(a->vo, st + dv + 2, st + dv + 3, OUT(r, h), st[0], st[1], st + 2, dv);
            }
    }
    for (int r = t->row0; r < t->row1; r++)
        for (int h = h0; h < h1; h++) a->vo->scale(OUT(r, h), dv, 1.0f / denominator(a, h, SLOT(r, h)[dv + 2], SLOT(r, h)[dv + 3]));
#undef SLOT
#undef OUT
}

void hk_attention_prefetch(const hk_att *a, int i) {
    const hk_att_task *t = &a->tasks[i];
    if (t->chunk < 0) return; /* prefill rows read each key block many times: the first fetch is a small part */
    const hk_seq *s = &a->seqs[t->seq];
    const int keys = (int)(NEXT_TASK_BYTES / hk_kv_row_bytes(s->kv_type, a->m->c.head_dim));
    int start, end;
    decode_keys(a, t, &start, &end);
    prefetch_kv(a, s, t->kvh, 0, start, imin(end, start + keys), 0);
    prefetch_kv(a, s, t->kvh, 1, start, imin(end, start + keys), 0);
}

/* A task runs with float32 denormals flushed to zero (MXCSR FTZ and DAZ), the thread's own setting put back after.
   Probabilities far below the row's largest (exp of -70 and less: common with wide score ranges) make denormal
   products in P V, and an Intel core takes a microcode assist on every instruction that meets one, about a hundred
   cycles: a Llama-3.2-1B prefill spent 68 % of its time in pv_f16 on a Xeon (58 tok/s; 190-204 flushed). AMD's Zen
   handles them at full speed. What is flushed is below 1.2e-38, nothing a softmax-weighted sum can show. */
void hk_attention_task(const hk_att *a, int i) {
#if defined(__x86_64__) || defined(__i386__)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ (bit 15) and DAZ (bit 6) */
#endif
    if (a->tasks[i].chunk >= 0)
        decode_task(a, &a->tasks[i]);
    else
        prefill_task(a, &a->tasks[i]);
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(csr);
#endif
}

int hk_attention_plan(const hk_model *m, const hk_seq *seqs, int n_seqs, const int *row_pos, int window, hk_att_task *tasks) {
    const hk_config *c = &m->c;
    int n = 0;
    for (int s = 0, row = 0; s < n_seqs; row += seqs[s].n_rows, s++) {
        const hk_seq *seq = &seqs[s];
        if (seq->n_rows == 1) {
            int p = row_pos[row];
            for (int kvh = 0; kvh < c->n_kv_heads; kvh++)
                for (int ch = lowest_key(p, window) / HK_ATT_CHUNK; ch <= p / HK_ATT_CHUNK; ch++)
                    tasks[n++] = (hk_att_task){s, kvh, row, row + 1, ch};
        } else { /* the last rows see the most keys: hand them out first */
            for (int b = (seq->n_rows - 1) / ROWS_PER_TASK; b >= 0; b--)
                for (int kvh = 0; kvh < c->n_kv_heads; kvh++)
                    tasks[n++] = (hk_att_task){s, kvh, row + b * ROWS_PER_TASK, row + imin(seq->n_rows, (b + 1) * ROWS_PER_TASK), -1};
        }
    }
    return n;
}

void hk_attention_merge_row(const hk_att *a, int r) {
    const hk_config *c = &a->m->c;
    if (a->seqs[a->row_seq[r]].n_rows != 1) return;
    const int dv = c->v_head_dim, p = a->row_pos[r], nch = p / HK_ATT_CHUNK + 1;
    for (int h = 0; h < c->n_heads; h++) {
        float M = -INFINITY, L = 0.0f, *o = a->att + ((size_t)r * c->n_heads + h) * dv;
        for (int ch = lowest_key(p, a->window) / HK_ATT_CHUNK; ch < nch; ch++) {
            const float *st = a->partial + a->row_slot[r] + ((size_t)h * nch + ch) * DECODE_SLOT(dv);
            merge(a->vo, &M, &L, o, st[0], st[1], st + 2, dv);
        }
        a->vo->scale(o, dv, 1.0f / denominator(a, h, M, L));
    }
}
