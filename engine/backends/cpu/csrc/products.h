/* The decoder's matrix products: activations quantized once per row for every weight type that reads them,
   and up to three matrices of one input cut into row chunks that the threads claim one by one. */
#ifndef HK_PRODUCTS_H
#define HK_PRODUCTS_H

#include "decoder.h"
#include "hk.h"
#include "matmul.h"
#include "vecops.h"

#define HK_ACT_KINDS 3 /* hk_act_kind values */

/* The kernel table matmul.c runs on. */
const hk_isa *hk_active_isa(void);

/* The activation kinds (bit mask) the given matrices (NULL: none) read. */
unsigned hk_act_kinds(const hk_matrix *a, const hk_matrix *b, const hk_matrix *c);

/* Where rows' activations live: per kind, row r's quantized values at mem[kind] + r * stride[kind] and its
   descriptor at acts[kind][r]. */
typedef struct {
    uint8_t *mem[HK_ACT_KINDS];
    size_t stride[HK_ACT_KINDS];
    hk_act *acts[HK_ACT_KINDS];
} hk_act_rows;

/* Quantize row r (x, cols elements) for every kind in the mask. */
void hk_prepare_acts(const hk_isa *isa, const hk_act_rows *rows, const float *x, int cols, unsigned kinds, int r);

typedef struct {
    const hk_isa *isa;
    const hk_matrix *w;
    float *out; /* (n, w->rows) */
    const hk_act *acts;
    int chunk, n_chunks;
} hk_product_part;

typedef struct {
    hk_product_part part[3];
    int n_parts, n, n_units;
    int glu, gelu; /* glu: out[0] becomes act(gate) * up, chunk by chunk (w[0] gate, w[1] up) */
    const hk_vecops *vo;
} hk_product;

/* out[i] (n, w[i]->rows) = x @ w[i].T for the matrices given (w[1], w[2] may be NULL), n rows whose
   activations hk_prepare_acts made. */
void hk_product_init(hk_product *p, const hk_isa *isa, const hk_vecops *vo, const hk_act_rows *rows, int n,
                     const hk_matrix *const w[3], float *const out[3], int glu, int gelu);
/* One row chunk of one matrix (with glu: of gate and up, then the activation); units are independent. */
void hk_product_unit(const hk_product *p, int unit);

#endif
