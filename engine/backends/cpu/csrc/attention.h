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

typedef struct {
    const hk_model *m;
    const hk_vecops *vo;
    int layer, window;
    const hk_seq *seqs;
    int n_seqs;
    const int *row_seq, *row_pos; /* (n,) sequence and position of every row */
    const float *q;               /* (n, n_heads, head_dim): rotated and scaled by attn_scale */
    float *att;                   /* (n, n_heads, v_head_dim): the output */
    float *partial;               /* per row from row_slot[row]: the (m, l, ...) states of its heads */
    const size_t *row_slot;       /* (n,) */
    hk_att_task *tasks; /* room for the count hk_attention_sizes gave */
    int n_tasks;
} hk_att;

/* Floats of partial state and task count the rows of this call need at most (whatever the window). */
void hk_attention_sizes(const hk_model *m, const hk_seq *seqs, int n_seqs, size_t *partial_floats, int *max_tasks);
/* Fill row_slot (the partial layout) for the call's rows; done once per call. */
void hk_attention_layout(const hk_model *m, const hk_seq *seqs, int n_seqs, size_t *row_slot);
/* Plan and run one layer's attention on the pool; decode rows still need hk_attention_merge_row. */
void hk_attention_run(hk_att *a);
/* A decode row: merge its key chunks' partials into att (every head). No-op for a prefill row. */
void hk_attention_merge_row(const hk_att *a, int row);

#endif
