/* arm64 NEON kernels with the dot-product extension (sdot, Armv8.2 and later). */
#include "hk.h"

#if defined(__aarch64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif

#define HK_SUFFIX _dotprod
#define HK_DOTPROD 1
#define HK_ISA_TABLE hk_isa_dotprod
#define HK_ISA_NAME "dotprod"
#include "kernels_arm.inc"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
