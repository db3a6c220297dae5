/* The IQ types' prompt-chunk products on 256-bit vectors, AVX-VNNI (the VEX-encoded vpdpbusd): 8 rows per vector, tiles of 4
   tokens (kernels_x86_iq_gemm.inc; the method is described in kernels_avx512_iq.c). */
#include "kernels_iq_gemm.h"

#include <stdlib.h>

#ifdef HK_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif

#define HK_SUFFIX _avxvnniiq
#define HK_VNNI 1
#define HK_NO_TABLE 1
#include "kernels_x86.inc"
#include "kernels_x86_iq_gemm.inc"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
