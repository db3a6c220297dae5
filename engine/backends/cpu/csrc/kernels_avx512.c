/* AVX-512 (F, BW, VL, VNNI) kernels: 512-bit versions of the hot types; the rest are the 256-bit kernels
   compiled with the EVEX-encoded VNNI dot products. */
#include "hk.h"

#ifdef HK_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

#define HK_SUFFIX _avx512
#define HK_VNNI 2
#define HK_NO_TABLE 1
#include "kernels_x86.inc"

const hk_isa hk_isa_avx512 = {
    .name = "avx512",
    .dot = {
        [HK_F32] = FN(dot_f32), [HK_F16] = FN(dot_f16), [HK_BF16] = FN(dot_bf16), [HK_Q4_0] = FN(dot_q4_0),
        [HK_Q4_1] = FN(dot_q4_1), [HK_Q5_0] = FN(dot_q5_0), [HK_Q5_1] = FN(dot_q5_1), [HK_Q8_0] = FN(dot_q8_0),
        [HK_Q2_K] = FN(dot_q2_k), [HK_Q3_K] = FN(dot_q3_k), [HK_Q4_K] = FN(dot_q4_k), [HK_Q5_K] = FN(dot_q5_k),
        [HK_Q6_K] = FN(dot_q6_k), [HK_TQ1_0] = FN(dot_tq1_0), [HK_TQ2_0] = FN(dot_tq2_0),
    },
    .quant32 = FN(quant32),
    .quantK = FN(quantK),
};

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
