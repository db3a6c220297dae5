/* Grouped-query attention of a call's rows over their sequences' KV caches, with the causal and sliding-window
   masks, in online-softmax blocks split over the thread pool. */
#ifndef HK_ATTENTION_H
#define HK_ATTENTION_H

#include <stddef.h>

#include "decoder.h"
#include "vecops.h"

#define HK_ATT_CHUNK 256 /* keys per chunk: chunks start at multiples of this absolute position */

/* One task: the rows [row0, row1) of one sequence against kv head kvh; chunk >= 0 for a decode row (one
   chunk of its keys, partial result kept for hk_attention_merge_row), -1 for a run of prefill rows. */
typedef struct {
    int seq, kvh, row0, row1, chunk;
} hk_att_task;

/* One layer's attention: what a task reads and writes. */
typedef struct {
    const hk_model *m;
    const hk_vecops *vo;
    int layer, window;
    const hk_seq *seqs;
    const int *row_seq, *row_pos; /* (n,) sequence and position of every row */
    const float *q;               /* (n, n_heads, head_dim): rotated and scaled by attn_scale */
    float *att;                   /* (n, n_heads, v_head_dim): the output */
    float *partial;               /* per row from row_slot[row]: the (m, l, ...) states of its heads */
    const size_t *row_slot;       /* (n,) */
    const hk_att_task *tasks;     /* from hk_attention_plan with this window */
} hk_att;

/* Floats of partial state and task count the rows of this call need at most (whatever the window). */
void hk_attention_sizes(const hk_model *m, const hk_seq *seqs, int n_seqs, size_t *partial_floats, int *max_tasks);
/* Fill row_slot (the partial layout) for the call's rows; done once per call. */
void hk_attention_layout(const hk_model *m, const hk_seq *seqs, int n_seqs, size_t *row_slot);
/* The tasks of a layer with this window (0: none) for the call's rows; returns their count. */
int hk_attention_plan(const hk_model *m, const hk_seq *seqs, int n_seqs, const int *row_pos, int window, hk_att_task *tasks);
/* Run task i; tasks of one plan are independent. Decode rows then need hk_attention_merge_row. */
void hk_attention_task(const hk_att *a, int i);
/* Ask for the first keys and values of decode task i, a task before it runs (nothing for prefill tasks). */
void hk_attention_prefetch(const hk_att *a, int i);
/* A q8_0 cache's rotations (attention.c): a row's queries (n_heads * head_dim) before its attention, its output
   (n_heads * v_head_dim) after; no-ops for other caches. */
void hk_kv_rotate_queries(const hk_config *c, const hk_seq *s, float *q);
void hk_kv_rotate_output(const hk_config *c, const hk_seq *s, float *o);
/* Write one row's keys k (d floats) and values v (dv floats) of one kv head into slot (a position index over
   layers, heads and capacity) of the sequence's cache, converted to its element type (q8_0: rotated first). */
void hk_kv_store(const hk_vecops *vo, const hk_seq *s, size_t slot, const float *k, int d, const float *v, int dv);
/* A decode row: merge its key chunks' partials into att (every head). No-op for a prefill row. */
void hk_attention_merge_row(const hk_att *a, int row);

#endif
