/* The decoder's vector primitives on 256-bit AVX2 + FMA + F16C vectors. */
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#define VW 8
#define VO_SUFFIX _avx2
#define VO_TABLE hk_vecops_avx2
#define VO_NAME "avx2"
#include "vecops_x86.inc"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
