/* AVX-VNNI kernels: the AVX2 kernels with the VEX-encoded dpbusd / dpwssd dot products. */
#include "hk.h"

#ifdef HK_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif

#define HK_SUFFIX _avxvnni
#define HK_VNNI 1
#define HK_ISA_TABLE hk_isa_avxvnni
#define HK_ISA_NAME "avxvnni"
#include "kernels_x86.inc"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
