/* Float32 vector primitives of the decoder (norms, activations, attention), one table per ISA.

   Every function's result depends only on its inputs and lengths, never on the thread or on how a caller
   batched its work: a speculative verify pass then reproduces a decode step bit for bit. */
#ifndef HK_VECOPS_H
#define HK_VECOPS_H

#include <stdint.h>

typedef struct {
    const char *name;
    /* s[r * ss + j] = q[r * qs ...] . k[j * d ...] for r < nr, j < n (keys d floats apart); a row's result
       does not depend on nr */
    void (*scores)(const float *q, int qs, int nr, const float *k, int d, int n, float *s, int ss);
    float (*max)(const float *x, int n);
    /* x[j] = exp(x[j] - m); returns the sum */
    float (*exp_sum)(float *x, int n, float m);
    /* o[r * os + (0:dv)] += sum_j p[r * ps + j] * v[j * dv ...] for r < nr, j < n; a row's result does not
       depend on nr */
    void (*pv)(const float *p, int ps, int nr, const float *v, int dv, int n, float *o, int os);
    /* scores and pv on float16 keys and values, converted as they load (NULL: convert a block first) */
    void (*scores_f16)(const float *q, int qs, int nr, const uint16_t *k, int d, int n, float *s, int ss);
    void (*pv_f16)(const float *p, int ps, int nr, const uint16_t *v, int dv, int n, float *o, int os);
    /* o = o * a + x * b */
    void (*axpby)(float *o, float a, const float *x, float b, int n);
    void (*scale)(float *x, int n, float s);
    float (*sum_sq)(const float *x, int n);
    /* y = (x * s) * w, as the reference norm computes it */
    void (*scale_mul)(float *y, const float *x, float s, const float *w, int n);
    /* g = act(g) * u with act silu (gelu = 0) or gelu_tanh (gelu = 1) */
    void (*glu)(float *g, const float *u, int n, int gelu);
    void (*f16_to_f32)(const uint16_t *x, float *y, int n);
    void (*f32_to_f16)(const float *x, uint16_t *y, int n);
    /* y[32 b + j] = the j-th value of q8_0 block b of x (34 bytes: float16 scale, 32 int8 codes), b < n_blocks */
    void (*q8_0_to_f32)(const uint8_t *x, float *y, int n_blocks);
} hk_vecops;

extern const hk_vecops hk_vecops_scalar;
#if defined(__x86_64__) || defined(_M_X64)
extern const hk_vecops hk_vecops_avx2;
extern const hk_vecops hk_vecops_avx512;
#endif

/* The table matching the kernels' active ISA (hk_isa_name()). */
const hk_vecops *hk_vecops_active(void);

/* x = cap * tanh(x / cap): gemma2's soft-capping of attention scores and of logits (cap > 0). */
void hk_softcap(float *x, int n, float cap);

/* Round-to-nearest-even float -> float16 bits (what F16C's conversion gives). */
uint16_t hk_f32_to_f16(float f);

#endif
