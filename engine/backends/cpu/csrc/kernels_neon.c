/* arm64 NEON kernels without the dot-product extension (widening multiplies and pairwise adds). */
#include "hk.h"

#if defined(__aarch64__)
#define HK_SUFFIX _neon
#define HK_DOTPROD 0
#define HK_ISA_TABLE hk_isa_neon
#define HK_ISA_NAME "neon"
#include "kernels_arm.inc"
#endif
