/* The matrix product driver and runtime ISA selection. */
#ifndef HK_MATMUL_H
#define HK_MATMUL_H

#include "hk.h"

typedef struct {
    int avx2, fma, f16c, bmi2, avx512f, avx512bw, avx512vl, avx512vnni, avx512bf16, avxvnni, neon, dotprod;
} hk_features;

void hk_cpu_features(hk_features *f);

/* Use the named ISA ("scalar"; "avx2", "avxvnni", "avx512" on x86-64; "neon", "dotprod" on arm64;
   "auto" or NULL: the best this CPU runs).
   Returns 0, or -1 when the name is unknown or this CPU cannot run it. */
int hk_select_isa(const char *name);
const char *hk_isa_name(void);
/* hk_stream_ahead's value for this CPU (hk.h). */
int hk_default_stream_ahead(void);
/* The 16-row type (hk.h) a matrix of type is worth repacking into under the active ISA, or -1: only where
   the ISA has its own 16-row kernels for it. */
int hk_repack_type(int type);
/* The names this CPU can run, comma-separated (for error messages). */
const char *hk_usable_isa_names(void);

/* Bytes of one token's quantized activations of cols elements for one kind: values, then scales (and sums),
   each array 64-byte aligned. */
size_t hk_act_bytes(int kind, int cols);
/* Quantize one token (x, cols elements) into mem (hk_act_bytes(kind, cols) bytes) and describe it in a. */
void hk_quantize_act(const hk_isa *isa, hk_act_kind kind, const float *x, int cols, uint8_t *mem, hk_act *a);

/* Rows [r0, r1) of W (cols elements each, stride bytes apart) against n tokens: out[t * rows + r] = W[r] . acts[t],
   a tile of tokens at a time, 16 rows per call where the ISA has a 16-row kernel. */
void hk_dot_rows(const hk_isa *isa, int type, const uint8_t *w, ptrdiff_t stride, int r0, int r1, int cols,
                 const hk_act *acts, int n, float *out, int rows);
/* Units a bandwidth-bound product (a decode step's) gives each thread: each unit a thread claims starts a new
   stream of reads, so few and long, but more than one, so a late thread can be helped (matmul.c, moe.c). */
#define HK_UNITS_PER_THREAD 2

/* Rows per task of a product of rows x cols weights with n tokens: decode-sized products in
   HK_UNITS_PER_THREAD units per thread, larger ones for L1 reuse across token tiles; a multiple of 16 where the
   16-row kernel runs. */
int hk_chunk_rows(const hk_isa *isa, int type, int rows, int n, int cols);

/* out (n, rows) = x (n, cols) @ W.T for W given as rows of packed blocks, w_stride bytes apart.
   Returns 0, or -1 when the scratch buffer could not grow. Not re-entrant: callers serialise. */
int hk_matmul(int type, const uint8_t *w, ptrdiff_t w_stride, int rows, int cols, const float *x, int n, float *out);

#endif
