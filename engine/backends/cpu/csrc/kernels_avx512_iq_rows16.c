/* AVX-512 (F, BW, VL, VNNI) products of 16 rows of IQ2_XS, IQ2_S or IQ3_S with a tile of a few tokens: the
   dot16 kernels a decode step runs. (The same scheme for IQ2_XXS and IQ3_XXS, their 7-bit sign indices
   through hk_ksigns or a parity computed in general registers, measured 0.6x their row kernels: they keep
   those.)

   Each row's super-block is decoded 64 values at a time: the grid entries by one gather (the indices built in
   a vector), the sign bits straight into a mask register (IQ2_S / IQ3_S store them whole; IQ2_XS's
   7-bit sign indices get their parity bit in a general register), the scales as int16 lanes. The
   grid magnitudes meet the activations, negated under the mask, in vpmaddubsw, and vpdpwssd applies the
   scales. A row's 16 int32 lanes are folded together with the other 15 rows' (a transpose-add tree), so
   lane r ends up holding row r's exact integer sum of the block without a horizontal sum per row.

   The float steps then are the decoded-tile products' (kernels_x86_iq_gemm.inc): acc += isum * (dw * da),
   one fused step per block, the rows in lanes; a token gets the same bits here as alone in the row kernel
   or in a prompt chunk. */
#include "hk.h"

#ifdef HK_X86
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

#define INLINE static inline __attribute__((always_inline))

INLINE __m128i loadu128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }
INLINE uint64_t u64_at(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* Eight 7-bit sign indices, one per byte, as whole sign bytes: bit 7 the parity of the seven bits (as hk_ksigns). */
INLINE uint64_t sign_bytes8(uint64_t s) {
    uint64_t p = s ^ (s >> 4); /* only bit 0 of each byte is kept: the next byte's bits land above it */
    p ^= p >> 2;
    p ^= p >> 1;
    return s | ((p & 0x0101010101010101ull) << 7);
}

/* int16 lanes of a 64-value chunk under two 32-value scales (IQ3_S): lanes 0-15 s0, 16-31 s1. */
INLINE __m512i scales32(int s0, int s1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)s0)), _mm256_set1_epi16((short)s1), 1);
}

/* int16 lanes of chunk c under four 16-value scales: the 16 nibbles of sc (8 bytes, low nibble first) as
   2 * nibble + 1, groups 4c .. 4c + 3 eight lanes each. */
INLINE __m512i scales16(__m512i sc16, int c) {
    static const int16_t group_of_lane[32] __attribute__((aligned(64))) = {
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    const __m512i pick = _mm512_add_epi16(_mm512_load_si512(group_of_lane), _mm512_set1_epi16((short)(4 * c)));
    return _mm512_permutexvar_epi16(pick, sc16);
}

/* The 16 scales 2 * nibble + 1 of 8 bytes of nibbles, as int16 lanes 0-15 (low nibble first). */
INLINE __m512i nibble_scales(const uint8_t *p) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p);
    __m128i n = _mm_unpacklo_epi8(_mm_and_si128(b, _mm_set1_epi8(0x0F)), _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F)));
    __m256i s = _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(n), 1), _mm256_set1_epi16(1));
    return _mm512_castsi256_si512(s);
}

/* One 64-value chunk c of a super-block: grid magnitudes q, negative-value mask neg, int16 scales sc. */
typedef struct {
    __m512i q, sc;
    __mmask64 neg;
} iq_chunk;

INLINE iq_chunk chunk_iq2_xs(const uint8_t *blk, __m512i sc16, int c) {
    __m128i raw = loadu128(blk + 2 + 16 * c);
    __m512i idx = _mm512_cvtepu16_epi64(_mm_and_si128(raw, _mm_set1_epi16(511)));
    __m128i s7 = _mm_srli_epi16(raw, 9);
    iq_chunk k = {_mm512_i64gather_epi64(idx, (const void *)hk_iq2xs_grid, 8), scales16(sc16, c),
                  _cvtu64_mask64(sign_bytes8((uint64_t)_mm_cvtsi128_si64(_mm_packus_epi16(s7, s7))))};
    return k;
}

INLINE iq_chunk chunk_iq2_s(const uint8_t *blk, __m512i sc16, int c) {
    __m512i lo = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(const void *)(blk + 2 + 8 * c)));
    __m512i hi = _mm512_srlv_epi64(_mm512_set1_epi64(hk_u16(blk + 66 + 2 * c)), _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14));
    __m512i idx = _mm512_or_si512(lo, _mm512_slli_epi64(_mm512_and_si512(hi, _mm512_set1_epi64(3)), 8));
    iq_chunk k = {_mm512_i64gather_epi64(idx, (const void *)hk_iq2s_grid, 8), scales16(sc16, c),
                  _cvtu64_mask64(u64_at(blk + 34 + 8 * c))};
    return k;
}

INLINE iq_chunk chunk_iq3_s(const uint8_t *blk, __m512i sc16, int c) {
    (void)sc16;
    __m512i lo = _mm512_cvtepu8_epi32(loadu128(blk + 2 + 16 * c));
    __m512i hi = _mm512_srlv_epi32(_mm512_set1_epi32(hk_u16(blk + 66 + 2 * c)),
                                   _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    __m512i idx = _mm512_or_si512(lo, _mm512_slli_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), 8));
    const int s = blk[106 + c];
    iq_chunk k = {_mm512_i32gather_epi32(idx, (const void *)hk_iq3s_grid, 4), scales32(2 * (s & 0xF) + 1, 2 * (s >> 4) + 1),
                  _cvtu64_mask64(u64_at(blk + 74 + 8 * c))};
    return k;
}

INLINE int block_bytes(int type) {
    return type == HK_IQ2_XS ? 74 : type == HK_IQ2_S ? 82 : 110;
}

/* The row kernels' float scale of a block: d times the type's factor. */
INLINE float block_dw(int type, const uint8_t *blk) {
    const float d = _cvtsh_ss(hk_u16(blk));
    return type == HK_IQ3_S ? 1.0f * d : 0.125f * d;
}

/* Super-block b of one row (at blk) against nt tokens: isum[t]'s 16 lanes add up to the exact integer sum. */
INLINE void row_block(const int type, const uint8_t *blk, const hk_act *a, int b, const int nt, __m512i *isum) {
    const __m512i sc16 = type == HK_IQ2_XS ? nibble_scales(blk + 66) : type == HK_IQ2_S ? nibble_scales(blk + 74)
                                                                                         : _mm512_setzero_si512();
    HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        iq_chunk k = type == HK_IQ2_XS ? chunk_iq2_xs(blk, sc16, c) : type == HK_IQ2_S ? chunk_iq2_s(blk, sc16, c)
                                                                           : chunk_iq3_s(blk, sc16, c);
        HK_UNROLL for (int t = 0; t < nt; t++) {
            __m512i av = _mm512_loadu_si512(a[t].qs + 256 * b + 64 * c);
            av = _mm512_mask_sub_epi8(av, k.neg, _mm512_setzero_si512(), av);
            isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(k.q, av), k.sc);
        }
    }
}

/* The transpose-add tree: two rows' lanes into one vector, each 128-bit lane [x, y, x, y] partial sums. */
INLINE __m512i fold32(__m512i x, __m512i y) { return _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y)); }
/* Two folded pairs into each 128-bit lane [r0, r1, r2, r3]. */
INLINE __m512i fold64(__m512i x, __m512i y) { return _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y)); }
/* Pairs of 128-bit lanes added: [x01, x23, y01, y23] (x, y: four rows each, per 128-bit lane). */
INLINE __m512i fold128(__m512i x, __m512i y) {
    return _mm512_add_epi32(_mm512_shuffle_i32x4(x, y, 0x88), _mm512_shuffle_i32x4(x, y, 0xDD));
}

INLINE void iq_rows16_nt(const int type, int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, const int nt,
                         float *out, ptrdiff_t os) {
    const int ts = block_bytes(type);
    __m512 acc[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        float dw[16] __attribute__((aligned(64)));
        __m512i quad[4][HK_MAX_NT], sum[HK_MAX_NT];
        for (int q4 = 0; q4 < 4; q4++) {
            __m512i pair[2][HK_MAX_NT];
            for (int h = 0; h < 2; h++) {
                const int r = 4 * q4 + 2 * h;
                const uint8_t *b0 = w + r * stride + (ptrdiff_t)b * ts, *b1 = b0 + stride;
                __m512i s0[HK_MAX_NT], s1[HK_MAX_NT];
                row_block(type, b0, a, b, nt, s0);
                row_block(type, b1, a, b, nt, s1);
                dw[r] = block_dw(type, b0);
                dw[r + 1] = block_dw(type, b1);
                HK_UNROLL for (int t = 0; t < nt; t++) pair[h][t] = fold32(s0[t], s1[t]);
            }
            HK_UNROLL for (int t = 0; t < nt; t++) quad[q4][t] = fold64(pair[0][t], pair[1][t]);
        }
        const __m512 dwv = _mm512_load_ps(dw);
        HK_UNROLL for (int t = 0; t < nt; t++) {
            sum[t] = fold128(fold128(quad[0][t], quad[1][t]), fold128(quad[2][t], quad[3][t]));
            __m512 scale = _mm512_mul_ps(dwv, _mm512_set1_ps(a[t].d[b]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), scale, acc[t]);
        }
    }
    HK_UNROLL for (int t = 0; t < nt; t++) _mm512_storeu_ps(out + t * os, acc[t]);
}

#define IQ_ROWS16(name, type)                                                                                  \
    void hk_rows16_##name(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out,     \
                          ptrdiff_t os) {                                                                      \
        switch (nt) {                                                                                          \
        case 1: iq_rows16_nt(type, nb, w, stride, a, 1, out, os); break;                                       \
        case 2: iq_rows16_nt(type, nb, w, stride, a, 2, out, os); break;                                       \
        case 3: iq_rows16_nt(type, nb, w, stride, a, 3, out, os); break;                                       \
        case 4: iq_rows16_nt(type, nb, w, stride, a, 4, out, os); break;                                       \
        default: for (int t = 0; t < nt; t += 4) hk_rows16_##name(nb, w, stride, a + t, nt - t < 4 ? nt - t : 4, out + t * os, os); \
        }                                                                                                      \
    }

IQ_ROWS16(iq2_xs, HK_IQ2_XS)
IQ_ROWS16(iq2_s, HK_IQ2_S)
IQ_ROWS16(iq3_s, HK_IQ3_S)

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
