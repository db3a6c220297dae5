/* Prompt-chunk products of the IQ super-block types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS): each
   weight block is decoded once per chunk of rows, into signed bytes, and multiplied with every token. */
#ifndef HK_IQ_GEMM_H
#define HK_IQ_GEMM_H

#include "hk.h"

/* Rows [r0, r1) of W against n tokens, as hk_dot_rows does. Returns 0, or -1 when its scratch could not
   grow (nothing written; the caller runs the row loop). */
typedef int (*hk_rows_fn)(int type, const uint8_t *w, ptrdiff_t stride, int r0, int r1, int cols, const hk_act *acts,
                          int n, float *out, int rows);

#define HK_IQ_GEMM_MIN_TOKENS 9 /* fewer tokens: one tile of the row kernels decodes no more blocks */
#define HK_IQ_GEMM_ROWS 64      /* rows per task: four 16-row groups share each tile of activations */

/* The decoded-tile product for this ISA, type and token count, or NULL (then the row loop runs). */
hk_rows_fn hk_iq_rows(const hk_isa *isa, int type, int n);
/* The one-row kernel that gives a token the same bits as hk_iq_rows's product, or NULL (use isa->dot). */
hk_dot_fn hk_iq_dot(const hk_isa *isa, int type);

#endif
