/* The decoder's vector primitives on 512-bit AVX-512F vectors (masked tails, scalef for exp). */
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f")
#endif

#define VW 16
#define VO_SUFFIX _avx512
#define VO_TABLE hk_vecops_avx512
#define VO_NAME "avx512"
#include "vecops_x86.inc"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
