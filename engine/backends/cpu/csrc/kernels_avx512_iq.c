/* AVX-512 (VNNI) products of the IQ super-block types for prompt chunks, and their one-row kernels.

   The row kernels decode a weight block (grid look-ups, sign bits, scales) once per tile of at most 8
   tokens, which costs more than the multiplication itself. Here a task's rows are decoded once, 16 rows at
   a time, into signed bytes laid out for vpdpbusd (lane r of a vector holds four consecutive values of row
   r), and then every token of the chunk is multiplied against them with one vpdpbusd per 64 products.
   vpdpbusd multiplies unsigned by signed bytes, so the activations go in offset by 128 (a ^ 0x80) and the
   weights' sums take the offset back out: sum(w * a) = sum(w * (a + 128)) - 128 * sum(w), exact integers.

   A super-block's integer sum then meets the float scales as acc += isum * (dw * da), one fused step per
   block per token, which is what the row kernels do too (the 512-bit ones below for IQ2_XS, IQ2_S, IQ3_S and
   IQ4_XS, kernels_x86_iq.inc's compiled here for IQ2_XXS and IQ3_XXS): a token gets the same bits in a prompt
   chunk, in a batch of a few, or alone. */
#include "kernels_iq_gemm.h"

#include <stdlib.h>

#ifdef HK_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni")
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
#define HK_IQ2_S_ROW_KERNEL FN(dot512_iq2_s)
#define HK_IQ2_XS_ROW_KERNEL FN(dot512_iq2_xs)
#define HK_IQ3_S_ROW_KERNEL FN(dot512_iq3_s)
static void FN(dot512_iq4_xs)(int nb, const uint8_t *w, const hk_act *a, int nt, float *out, ptrdiff_t os);
static void FN(dot512_iq2_s)(int nb, const uint8_t *w, const hk_act *a, int nt, float *out, ptrdiff_t os);
static void FN(dot512_iq2_xs)(int nb, const uint8_t *w, const hk_act *a, int nt, float *out, ptrdiff_t os);
static void FN(dot512_iq3_s)(int nb, const uint8_t *w, const hk_act *a, int nt, float *out, ptrdiff_t os);
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

/* IQ2_S with two 32-element sub-blocks per 512-bit vector, and no gathers (the reverted 16-row kernels gathered
   their grid entries and lost on the whole model, cause not established). Each grid index (a qs byte, two bits of a qh byte above it) is built in a general register,
   four at a time by pdep, and its entry loaded 64 bits at a time straight into its place; the block's sign bits
   are a mask register that negates the activations, its 16 scales spread over int16 lanes by vpermw. Each
   super-block is summed exactly, as iq_accumulate adds it. Block: d, qs[32], signs[32], qh[8], scales[8].
   (Built in a vector and stored, the indices cost more: 32 reloads, or 8 and the same extraction.) */

/* Vector c of a block (values 64c .. 64c + 63) has groups of 16 values 4c .. 4c + 3: the int16 lanes of its
   maddubs sums take the scale of group 4c + lane / 8. */
static const uint16_t IQ2S_SCALE_LANE[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13, 14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};

/* The four 10-bit grid indices of sub-block ib in the 16-bit fields of a word: qs byte k, and above it bits
   2k, 2k + 1 of the sub-block's qh byte. */
INLINE uint64_t iq2_s_index4(const uint8_t *blk, int ib) {
    return _pdep_u64(hk_u32(blk + 2 + 4 * ib), 0x00FF00FF00FF00FFull) | _pdep_u64(blk[66 + ib], 0x0300030003000300ull);
}

/* Grid entries i0 and i1 (16 values) in one 128-bit vector, each a single 64-bit load. */
INLINE __m128i grid_pair(const uint64_t *grid, unsigned i0, unsigned i1) {
    return _mm_insert_epi64(_mm_loadl_epi64((const __m128i *)(const void *)(grid + i0)), (long long)grid[i1], 1);
}

/* The 32 grid values of four indices in the 16-bit fields of u. */
INLINE __m256i grid_values4(const uint64_t *grid, uint64_t u) {
    const __m128i lo = grid_pair(grid, u & 0xFFFF, (uint32_t)u >> 16), hi = grid_pair(grid, (u >> 32) & 0xFFFF, u >> 48);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* The 32 grid values of IQ2_S sub-block ib. */
INLINE __m256i iq2_s_sub_values(const uint8_t *blk, int ib) { return grid_values4(hk_iq2s_grid, iq2_s_index4(blk, ib)); }

/* The 16 scales 2 * nibble + 1 of 8 bytes at p as int16, group order (low nibble first). */
INLINE __m512i iq2_scales16(const uint8_t *p) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p), m4 = _mm_set1_epi8(0x0F);
    const __m256i s = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4)));
    return _mm512_castsi256_si512(_mm256_add_epi16(_mm256_add_epi16(s, s), _mm256_set1_epi16(1)));
}

/* Shared by the IQ2_S, IQ2_XS and IQ3_S row kernels: 64 values (two sub-blocks) of every token's activations,
   negated where the weights' sign bits say, times the unsigned grid values, summed with their scales into isum. */
INLINE void iq_signed_dot64(__m512i q, __m512i scale, __mmask64 neg, const hk_act *a, int nt, int b, int c, __m512i *isum) {
    HK_UNROLL for (int t = 0; t < nt; t++) {
        __m512i av = _mm512_loadu_si512(a[t].qs + 256 * b + 64 * c);
        av = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
        isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(q, av), scale);
    }
}

/* An IQ2 block's exact integer sums into the float accumulators: acc += sum * (d / 8 * activation scale). */
INLINE void iq2_block_done(const uint8_t *blk, const hk_act *a, int nt, int b, const __m512i *isum, float *acc) {
    const float dw = 0.125f * f16x(blk);
    HK_UNROLL for (int t = 0; t < nt; t++) {
        __m128 p = _mm_cvtsi32_ss(_mm_setzero_ps(), _mm512_reduce_add_epi32(isum[t]));
        acc[t] = _mm_cvtss_f32(_mm_fmadd_ss(p, _mm_set_ss(dw * a[t].d[b]), _mm_set_ss(acc[t])));
    }
}

INLINE void dot512_iq2_s_nt(int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    float acc[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 82;
        const __m512i sc = iq2_scales16(blk + 74);
        __m512i isum[HK_MAX_NT];
        HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_setzero_si512();
        HK_UNROLL for (int c = 0; c < 4; c++) {
            const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(iq2_s_sub_values(blk, 2 * c)), iq2_s_sub_values(blk, 2 * c + 1), 1);
            const __m512i scale = _mm512_permutexvar_epi16(_mm512_loadu_si512(IQ2S_SCALE_LANE[c]), sc);
            uint64_t bits;
            memcpy(&bits, blk + 34 + 8 * c, 8);
            const __mmask64 neg = _cvtu64_mask64(bits); /* bit j: value 64c + j negative */
            iq_signed_dot64(q, scale, neg, a, nt, b, c, isum);
        }
        iq2_block_done(blk, a, nt, b, isum, acc);
    }
    iq_store(acc, nt, out, os);
}
NT_DISPATCH(dot512_iq2_s)

/* IQ2_XS the same way: per 32 values, four 16-bit words of a 9-bit grid index and a 7-bit sign index (the 8th
   sign makes the count of negatives even), so the block's 256 sign bits come from one vector of its 32 words.
   Block: d, qs[32] words, scales[8]. */
INLINE void iq2_xs_signs(const uint8_t *blk, uint64_t *bits) {
    const __m512i s = _mm512_srli_epi16(_mm512_loadu_si512(blk + 2), 9);
    __m512i p = _mm512_xor_si512(s, _mm512_srli_epi16(s, 4));
    p = _mm512_xor_si512(p, _mm512_srli_epi16(p, 2));
    p = _mm512_xor_si512(p, _mm512_srli_epi16(p, 1));
    p = _mm512_slli_epi16(_mm512_and_si512(p, _mm512_set1_epi16(1)), 7);
    _mm256_store_si256((__m256i *)(void *)bits, _mm512_cvtepi16_epi8(_mm512_or_si512(s, p)));
    __asm__("" : "+m"(*(struct { uint64_t v[4]; } *)(void *)bits)); /* read back as masks, not extracted */
}

INLINE __m256i iq2_xs_sub_values(const uint8_t *blk, int ib) {
    uint64_t u;
    memcpy(&u, blk + 2 + 8 * ib, 8);
    return grid_values4(hk_iq2xs_grid, u & 0x01FF01FF01FF01FFull);
}

INLINE void dot512_iq2_xs_nt(int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    float acc[HK_MAX_NT];
    _Alignas(32) uint64_t signs[4];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 74;
        const __m512i sc = iq2_scales16(blk + 66);
        iq2_xs_signs(blk, signs);
        __m512i isum[HK_MAX_NT];
        HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_setzero_si512();
        HK_UNROLL for (int c = 0; c < 4; c++) {
            const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(iq2_xs_sub_values(blk, 2 * c)), iq2_xs_sub_values(blk, 2 * c + 1), 1);
            const __m512i scale = _mm512_permutexvar_epi16(_mm512_loadu_si512(IQ2S_SCALE_LANE[c]), sc);
            const __mmask64 neg = _cvtu64_mask64(signs[c]);
            iq_signed_dot64(q, scale, neg, a, nt, b, c, isum);
        }
        iq2_block_done(blk, a, nt, b, isum, acc);
    }
    iq_store(acc, nt, out, os);
}
NT_DISPATCH(dot512_iq2_xs)

/* IQ3_S the same way, with grid entries of 4 values (32 bits): per 32 values, eight qs bytes with a ninth index
   bit each in a qh byte, whole sign bytes, a 4-bit scale. Block: d, qs[64], qh[8], signs[32], scales[4]. */
static const uint16_t IQ3S_SCALE_LANE[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}};

/* Grid entries of four indices in the 16-bit fields of u, 16 values. */
INLINE __m128i iq3_s_grid4(uint64_t u) {
    const uint32_t *g = hk_iq3s_grid;
    __m128i v = _mm_cvtsi32_si128((int)g[u & 0xFFFF]);
    v = _mm_insert_epi32(v, (int)g[(uint32_t)u >> 16], 1);
    v = _mm_insert_epi32(v, (int)g[(u >> 32) & 0xFFFF], 2);
    return _mm_insert_epi32(v, (int)g[u >> 48], 3);
}

/* The 32 grid values of sub-block ib. */
INLINE __m256i iq3_s_sub_values(const uint8_t *blk, int ib) {
    const unsigned h = blk[66 + ib];
    const uint64_t u0 = _pdep_u64(hk_u32(blk + 2 + 8 * ib), 0x00FF00FF00FF00FFull) | _pdep_u64(h & 0xF, 0x0100010001000100ull);
    const uint64_t u1 = _pdep_u64(hk_u32(blk + 6 + 8 * ib), 0x00FF00FF00FF00FFull) | _pdep_u64(h >> 4, 0x0100010001000100ull);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(iq3_s_grid4(u0)), iq3_s_grid4(u1), 1);
}

/* The 8 scales 2 * nibble + 1 of a block as int16, low nibble first. */
INLINE __m512i iq3_s_scales(const uint8_t *blk) {
    const __m128i b = _mm_cvtsi32_si128((int)hk_u32(blk + 106)), m4 = _mm_set1_epi8(0x0F);
    const __m128i s = _mm_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4)));
    return _mm512_castsi128_si512(_mm_add_epi16(_mm_add_epi16(s, s), _mm_set1_epi16(1)));
}

INLINE void dot512_iq3_s_nt(int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    float acc[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 110;
        const __m512i sc = iq3_s_scales(blk);
        __m512i isum[HK_MAX_NT];
        HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_setzero_si512();
        HK_UNROLL for (int c = 0; c < 4; c++) {
            const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(iq3_s_sub_values(blk, 2 * c)), iq3_s_sub_values(blk, 2 * c + 1), 1);
            const __m512i scale = _mm512_permutexvar_epi16(_mm512_loadu_si512(IQ3S_SCALE_LANE[c]), sc);
            uint64_t bits;
            memcpy(&bits, blk + 74 + 8 * c, 8);
            const __mmask64 neg = _cvtu64_mask64(bits);
            iq_signed_dot64(q, scale, neg, a, nt, b, c, isum);
        }
        const float dw = 1.0f * f16x(blk);
        HK_UNROLL for (int t = 0; t < nt; t++) {
            __m128 p = _mm_cvtsi32_ss(_mm_setzero_ps(), _mm512_reduce_add_epi32(isum[t]));
            acc[t] = _mm_cvtss_f32(_mm_fmadd_ss(p, _mm_set_ss(dw * a[t].d[b]), _mm_set_ss(acc[t])));
        }
    }
    iq_store(acc, nt, out, os);
}
NT_DISPATCH(dot512_iq3_s)

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif
