/* AVX2 + FMA + F16C kernels: 256-bit vectors, maddubs integer dot products. */
#include "hk.h"

#ifdef HK_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#define HK_SUFFIX _avx2
#define HK_VNNI 0
#define HK_ISA_TABLE hk_isa_avx2
#define HK_ISA_NAME "avx2"
#include "kernels_x86.inc"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
