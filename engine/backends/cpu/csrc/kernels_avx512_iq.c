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
#define HK_IQ4_XS_ROW_KERNEL FN(dot512_iq4_xs)
static void FN(dot512_iq4_xs)(int nb, const uint8_t *w, const hk_act *a, int nt, float *out, ptrdiff_t os);
#include "kernels_x86_iq_gemm.inc"

/* IQ4_XS with two 32-element sub-blocks per 512-bit vector (the values' magnitudes against the activations
   negated where a value is negative), each super-block summed exactly, as iq_accumulate adds it. */
INLINE void dot512_iq4_xs_nt(int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    const __m512i table = _mm512_broadcast_i32x4(loadu128(hk_kvalues_iq4nl)), m4 = _mm512_set1_epi8(0x0F);
    float acc[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 136;
        __m512i isum[HK_MAX_NT];
        HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) { /* sub-blocks 2c and 2c + 1: elements 64c .. 64c + 63 */
            __m256i raw = loadu256(blk + 8 + 32 * c);
            __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
            __m512i v = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), m4));
            __m512i uv = _mm512_abs_epi8(v);
            __mmask64 neg = _mm512_movepi8_mask(v);
            __m512i scale = _mm512_inserti64x4(_mm512_set1_epi16((short)group_scale(HK_IQ4_XS, blk, 2 * c)),
                                               _mm256_set1_epi16((short)group_scale(HK_IQ4_XS, blk, 2 * c + 1)), 1);
            HK_UNROLL for (int t = 0; t < nt; t++) {
                __m512i av = _mm512_loadu_si512(a[t].qs + 256 * b + 64 * c);
                av = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
                isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(uv, av), scale);
            }
        }
        const float dw = f16x(blk);
        HK_UNROLL for (int t = 0; t < nt; t++) {
            __m128 p = _mm_cvtsi32_ss(_mm_setzero_ps(), _mm512_reduce_add_epi32(isum[t]));
            acc[t] = _mm_cvtss_f32(_mm_fmadd_ss(p, _mm_set_ss(dw * a[t].d[b]), _mm_set_ss(acc[t])));
        }
    }
    iq_store(acc, nt, out, os);
}
NT_DISPATCH(dot512_iq4_xs)

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif
