/* The fused decoder: a model handle built once from the packed GGUF weights, and one forward call per chunk
   of tokens (prefill) or per decode step of one or several sequences, all layers in C. */
#ifndef HK_DECODER_H
#define HK_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "hk.h"

/* A weight matrix as GGUF stores it: rows of packed blocks, stride bytes apart (a view into the mmap). */
typedef struct {
    const uint8_t *data;
    ptrdiff_t stride;
    int type, rows, cols;
} hk_matrix;

typedef struct {
    hk_matrix wq, wk, wv, wo, gate, up, down;
    const float *attn_norm, *ffn_norm;             /* NULL (no norm before the block), or (n_embd,) */
    const float *bq, *bk, *bv;                     /* NULL, or (n_heads * head_dim,) / (n_kv_heads * head_dim,) */
    const float *q_norm, *k_norm;                  /* NULL, or (head_dim,) per head; with qk_norm_whole the whole
                                                      projection: (n_heads * head_dim,) / (n_kv_heads * head_dim,) */
    const float *post_attn_norm, *post_ffn_norm;   /* NULL, or (n_embd,) */
    int rope_set;                                  /* row of hk_model.inv_freq this layer rotates with; -1: no RoPE */
    int window;                                    /* 0, or keys with q_pos - k_pos < window only */
    const float *bo;                               /* NULL, or (n_embd,): the attention output's bias */
    const float *sinks;                            /* NULL, or (n_heads,): logits that join each head's softmax */
    /* mixture of experts (moe.h) where router.data is not NULL; gate/up/down are then its shared expert (of
       n_ff rows), or absent (data NULL) */
    hk_matrix router;                              /* (n_expert, n_embd) */
    hk_matrix gate_exps, up_exps, down_exps;       /* (n_expert * n_ff_exp, n_embd) x 2, (n_expert * n_embd, n_ff_exp) */
    const float *b_router;                         /* NULL, or (n_expert,) */
    const float *b_gate_exps, *b_up_exps, *b_down_exps; /* NULL, or (n_expert * n_ff_exp,) x 2, (n_expert * n_embd,) */
    const float *exp_probs_b;                      /* NULL, or (n_expert,): added for the choice only */
    const float *shexp_gate;                       /* NULL, or (n_embd,): the shared expert's output is divided by
                                                      1 + exp(-h . shexp_gate) */
} hk_layer;

typedef struct {
    int n_layers, n_embd, n_ff, n_heads, n_kv_heads, head_dim, v_head_dim, n_vocab;
    int rope_dim, rope_neox, gelu, max_rows; /* gelu: 0 silu, 1 gelu_tanh, 2 swiglu_oai (experts only) */
    int n_rope_sets;      /* rows of hk_model.inv_freq (1 to HK_MAX_ROPE_SETS) */
    int qk_norm_whole;    /* 1: q_norm and k_norm normalise the whole projection, before the split into heads */
    int attn_temp_floor;  /* temperature tuning: positions per step of the query scale; 0 = off */
    float rms_eps, embed_scale, attn_scale;
    float attn_softcap;   /* scores become c * tanh(scores / c) before the softmax; 0 = off */
    float final_softcap;  /* logits become c * tanh(logits / c); 0 = off */
    float residual_scale; /* attention and FFN block outputs are multiplied by it before their residual add */
    float logit_scale;    /* logits are multiplied by it (before the final softcap) */
    float rope_mscale;    /* cos and sin of every rotation are multiplied by it */
    float attn_temp_scale; /* queries after RoPE: * (log(floor(pos / attn_temp_floor) + 1) * scale + 1) */
    int n_expert, n_expert_used, n_ff_exp; /* 0: no experts */
    int expert_gating;    /* moe.h HK_GATING_*: router logits -> probabilities */
    int expert_norm;      /* 1: the chosen weights renormalised to sum to 1 */
    float expert_weights_scale; /* the chosen weights times it (0 or 1: unscaled) */
} hk_config;

#define HK_MAX_ROPE_SETS 8

/* Scratch reused by every call: float32 activations of up to max_rows rows (the views: decoder.c, layout),
   and the attention's tasks and partial states, which grow with the context (never shrunk). */
typedef struct {
    void *mem;
    size_t size;
    void *att_mem; /* tasks, then partial states from att_tasks_bytes on */
    size_t att_size, att_tasks_bytes;
} hk_arena;

typedef struct {
    hk_config c;
    hk_layer *layers;
    hk_matrix embd, output;
    const float *output_norm;
    const double *inv_freq; /* (c.n_rope_sets, rope_dim / 2): the effective inverse frequencies of engine/rope.py */
    hk_arena arena;
} hk_model;

/* Element types of a KV cache. q8_0 is llama.cpp's block: 32 int8 codes after one float16 scale (34 bytes),
   so a key or value row of dim elements takes dim / 32 blocks (dim a multiple of 32). */
enum { HK_KV_F32 = 0, HK_KV_F16 = 1, HK_KV_Q8_0 = 2 };

/* One sequence of a call: its KV cache (every layer's (n_kv_heads, capacity, head_dim) block, layer after
   layer, of one HK_KV_* type) and the rows of this call that append to it. */
typedef struct {
    void *k, *v;   /* (n_layers, n_kv_heads, capacity, head_dim) and (..., v_head_dim) elements */
    int capacity;  /* positions per layer and head */
    int n_past;    /* positions filled before this call */
    int n_rows;    /* rows of this call, at positions n_past .. n_past + n_rows - 1 */
    int kv_type;   /* HK_KV_F32, HK_KV_F16 or HK_KV_Q8_0 */
} hk_seq;

/* Bytes of one cached key or value row of dim elements in a cache of kv_type. */
static inline size_t hk_kv_row_bytes(int kv_type, int dim) {
    return kv_type == HK_KV_Q8_0 ? (size_t)dim / 32 * 34 : (size_t)dim * (kv_type == HK_KV_F16 ? 2 : 4);
}

enum { HK_LOGITS_NONE = 0, HK_LOGITS_LAST = 1, HK_LOGITS_ALL = 2 };

/* Allocate the scratch arena for c->max_rows rows. The layers, matrices and inv_freq stay owned by the
   caller and must outlive the model. Returns 0, -1 when out of memory, or -3 for a model it cannot run (RoPE
   sets out of 1..HK_MAX_ROPE_SETS, sliding layers of different windows). */
int hk_model_init(hk_model *m);
void hk_model_free(hk_model *m);

/* Run the decoder on n = sum of seqs[i].n_rows <= max_rows tokens (the rows of seqs[0] first), writing their
   keys and values into the caches (which must have room). logits: HK_LOGITS_LAST writes (n_seqs, n_vocab),
   the last row of each sequence; HK_LOGITS_ALL (n, n_vocab). Not re-entrant (one pool, one arena).
   Returns 0, -1 out of memory, -2 a token id out of range, -3 bad sequence sizes. */
int hk_model_forward(hk_model *m, const int32_t *tokens, const hk_seq *seqs, int n_seqs, float *logits, int logits_mode);

#endif
