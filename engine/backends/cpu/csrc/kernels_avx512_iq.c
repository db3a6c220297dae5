/* AVX-512 (VNNI) products of the IQ super-block types for prompt chunks, and their one-row kernels.

   The row kernels decode a weight block (grid look-ups, sign bits, scales) once per tile of at most 8
   tokens, which costs more than the multiplication itself. Here a task's rows are decoded once, 16 rows at
   a time, into signed bytes laid out for vpdpbusd (lane r of a vector holds four consecutive values of row
   r), and then every token of the chunk is multiplied against them with one vpdpbusd per 64 products.
   vpdpbusd multiplies unsigned by signed bytes, so the activations go in offset by 128 (a ^ 0x80) and the
   weights' sums take the offset back out: sum(w * a) = sum(w * (a + 128)) - 128 * sum(w), exact integers.

   A super-block's integer sum then meets the float scales as acc += isum * (dw * da), one fused step per
   block per token, which is what the row kernels (kernels_x86_iq.inc, compiled here for this ISA) do
   too: a token gets the same bits in a prompt chunk, in a batch of a few, or alone. */
#include "kernels_iq_gemm.h"

#include <stdlib.h>

#ifdef HK_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

#define HK_SUFFIX _avx512iq
#define HK_VNNI 2
#define HK_NO_TABLE 1
#define NT_DISPATCH_WIDE(name)                                                                            \
    case 5: name##_nt(nb, w, a, 5, out, os); break;                                                       \
    case 6: name##_nt(nb, w, a, 6, out, os); break;                                                       \
    case 7: name##_nt(nb, w, a, 7, out, os); break;                                                       \
    case 8: name##_nt(nb, w, a, 8, out, os); break;
#include "kernels_x86.inc"

#define HK_IQ_GEMM_512 1
#include "kernels_x86_iq_gemm.inc"

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif
