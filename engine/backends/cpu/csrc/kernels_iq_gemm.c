/* Which ISA runs the IQ types' prompt-chunk products (kernels_x86_iq_gemm.inc), compiled without any target
   extension so that it runs on every CPU. */
#include "kernels_iq_gemm.h"

#ifdef HK_X86
int hk_iq_rows_avx2iq(int type, const uint8_t *w, ptrdiff_t stride, int r0, int r1, int cols, const hk_act *acts, int n,
                      float *out, int rows);
int hk_iq_rows_avxvnniiq(int type, const uint8_t *w, ptrdiff_t stride, int r0, int r1, int cols, const hk_act *acts,
                         int n, float *out, int rows);
int hk_iq_rows_avx512iq(int type, const uint8_t *w, ptrdiff_t stride, int r0, int r1, int cols, const hk_act *acts,
                        int n, float *out, int rows);
hk_dot_fn hk_iq_row_kernel_avx2iq(int type);
hk_dot_fn hk_iq_row_kernel_avxvnniiq(int type);
hk_dot_fn hk_iq_row_kernel_avx512iq(int type);

hk_rows_fn hk_iq_rows(const hk_isa *isa, int type, int n) {
    if (n < HK_IQ_GEMM_MIN_TOKENS) return NULL;
    if (isa == &hk_isa_avx512) return hk_iq_row_kernel_avx512iq(type) ? hk_iq_rows_avx512iq : NULL;
    if (isa == &hk_isa_avxvnni) return hk_iq_row_kernel_avxvnniiq(type) ? hk_iq_rows_avxvnniiq : NULL;
    if (isa == &hk_isa_avx2) return hk_iq_row_kernel_avx2iq(type) ? hk_iq_rows_avx2iq : NULL;
    return NULL;
}

/* AVX-512's own IQ4_XS row kernel (kernels_avx512.c) sums in another order; the 256-bit row kernels of the
   other ISAs are the ones their products agree with already. */
hk_dot_fn hk_iq_dot(const hk_isa *isa, int type) { return isa == &hk_isa_avx512 ? hk_iq_row_kernel_avx512iq(type) : NULL; }

#else /* not x86-64: the row loop with each ISA's own kernels */

hk_rows_fn hk_iq_rows(const hk_isa *isa, int type, int n) { (void)isa, (void)type, (void)n; return NULL; }
hk_dot_fn hk_iq_dot(const hk_isa *isa, int type) { (void)isa, (void)type; return NULL; }

#endif
