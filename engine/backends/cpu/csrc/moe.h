/* The fused decoder's mixture-of-experts FFN (llama.cpp's build_moe_ffn; engine/moe.py is the reference):
   per row the router's logits, the top-k experts and their weights; the call's (row, choice) pairs grouped by
   expert; each chosen expert's gate/up and down products over its pairs only, reading only that expert's rows
   of the 3-D expert tensors (expert e's rows are a contiguous slice); the weighted sum. */
#ifndef HK_MOE_H
#define HK_MOE_H

#include <stddef.h>

#include "decoder.h"
#include "products.h"

enum { HK_GATING_SOFTMAX = 0, HK_GATING_SIGMOID = 1, HK_GATING_SOFTMAX_WEIGHT = 2 }; /* hk_config.expert_gating */
#define HK_MAX_EXPERTS 4096 /* as engine/config.py */
#define HK_MAX_EXPERTS_USED 64
#define HK_ACT_SWIGLU_OAI 2 /* hk_config.gelu: gpt-oss's clamped SwiGLU (the experts only) */

/* One call's MoE state: views into the decoder's arena (sizes from hk_moe_layout), shapes in comments. */
typedef struct {
    const hk_model *m;
    const hk_isa *isa;
    const hk_vecops *vo;
    const hk_act_rows *acts;  /* the decoder's row activations (the experts' input) */
    int n;                    /* rows of the call */
    float *logits;            /* (R, n_expert) router logits, then probabilities */
    int *choice;              /* (R, K) chosen experts, most probable first */
    float *weight;            /* (R, K) their weights */
    int *pair_of;             /* (R, K) the pair index of each choice */
    int *pair_row;            /* (P,) pairs grouped by expert, ascending; rows ascending within an expert */
    int *start;               /* (n_expert + 1,) the pairs of expert e: start[e] .. start[e + 1] */
    int *active;              /* (n_expert,) experts with pairs, ascending; *n_active of them */
    int *n_active;            /* (1,) */
    hk_act *pair_acts[HK_ACT_KINDS]; /* (P,) each pair's row activations, gathered */
    hk_act_rows down_acts;    /* (P, hk_act_bytes(kind, n_ff_exp)): each pair's hidden, quantized */
    float *hidden;            /* (P, n_ff_exp) act(gate) * up */
    float *up;                /* (P, n_ff_exp) */
    float *y;                 /* (P, n_embd) the experts' outputs */
    float *shexp_den;         /* (R,) the shared expert's divisor, 1 + exp(-h . shexp_gate) */
} hk_moe;

/* Lay the MoE views out from base (only count the bytes when s is NULL); 0 for a model without experts. */
size_t hk_moe_layout(const hk_config *c, uint8_t *base, hk_moe *s);

/* Row r's FFN input h (normed, n_embd): quantize it for the router, the experts and the shared expert (if
   any), route it. */
void hk_moe_route_row(const hk_moe *s, int layer, const float *h, int r);
/* Group the call's choices by expert (one unit, after every row is routed). */
void hk_moe_group(const hk_moe *s, int layer);
/* Units of the experts' gate/up (down = 0) or down (down = 1) phase for this call: an upper bound, the
   units past the chosen experts do nothing. */
int hk_moe_units(const hk_moe *s, int layer, int down);
void hk_moe_unit(const hk_moe *s, int layer, int down, int unit);
/* Row r: quantize its pairs' hidden states for the down product (and the shared expert's, from g). */
void hk_moe_down_in_row(const hk_moe *s, int layer, int r, const float *g);
/* Row r: o = the weighted sum of its experts' outputs (their down biases added), in expert order, plus the
   shared expert's output (NULL: none) over its divisor. */
void hk_moe_out_row(const hk_moe *s, int layer, int r, float *o, const float *shared);

#endif
