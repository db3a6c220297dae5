/* AVX-512 (F, BW, VL, VNNI) kernels: 512-bit versions of the hot types; the rest are the 256-bit kernels
   compiled with the EVEX-encoded VNNI dot products. */
#include "hk.h"

#include <math.h>

#ifdef HK_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

#define HK_SUFFIX _avx512
#define HK_VNNI 2
#define HK_NO_TABLE 1
#define NT_DISPATCH_WIDE(name)                                                                            \
    case 5: name##_nt(nb, w, a, 5, out, os); break;                                                       \
    case 6: name##_nt(nb, w, a, 6, out, os); break;                                                       \
    case 7: name##_nt(nb, w, a, 7, out, os); break;                                                       \
    case 8: name##_nt(nb, w, a, 8, out, os); break;
#include "kernels_x86.inc"

/* -- legacy 32-blocks two at a time in 512-bit vectors: lanes 0-7 hold block b, lanes 8-15 block b+1 */

/* The 32 + 32 four-bit codes of two blocks, each block's low nibbles before its high nibbles. */
INLINE __m512i pair_nibbles(const uint8_t *qs0, const uint8_t *qs1) {
    __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(loadu128(qs0)), loadu128(qs1), 1);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1); /* qs0 qs1 qs0>>4 qs1>>4 */
    return _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(0x0F));
}

/* Two float16 fields (one per block) as floats in lanes 0 and 1. */
INLINE __m128 pair_f16(const uint8_t *p0, const uint8_t *p1) {
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)(hk_u16(p0) | ((uint32_t)hk_u16(p1) << 16))));
}

INLINE __m128 load2(const float *p) { return _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(const void *)p)); }

INLINE void dot32x2_nt(const int type, int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    const int ts = size32(type);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512 acc[HK_MAX_NT];
    __m128 corr[HK_MAX_NT];
    __m256 tail[HK_MAX_NT];
    float tail_corr[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) {
        acc[t] = _mm512_setzero_ps();
        corr[t] = _mm_setzero_ps();
        tail[t] = _mm256_setzero_ps();
        tail_corr[t] = 0.0f;
    }
    int b = 0;
    for (; b + 1 < nb; b += 2) {
        const uint8_t *b0 = w + (size_t)b * ts, *b1 = b0 + ts;
        __m128 dw = type == HK_MXFP4 ? _mm_setr_ps(hk_e8m0_half(b0[0]), hk_e8m0_half(b1[0]), 0.0f, 0.0f) : pair_f16(b0, b1);
        __m128 cw = _mm_setzero_ps();
        __m512i q;
        __mmask64 neg = 0;
        switch (type) {
        case HK_Q4_0: q = pair_nibbles(b0 + 2, b1 + 2); cw = _mm_mul_ps(dw, _mm_set1_ps(-8.0f)); break;
        case HK_Q4_1: q = pair_nibbles(b0 + 4, b1 + 4); cw = pair_f16(b0 + 2, b1 + 2); break;
        case HK_Q5_0:
        case HK_Q5_1: {
            const int o = type == HK_Q5_0 ? 2 : 4;
            __mmask64 bits = (__mmask64)hk_u32(b0 + o) | ((__mmask64)hk_u32(b1 + o) << 32);
            q = pair_nibbles(b0 + o + 4, b1 + o + 4);
            q = _mm512_mask_add_epi8(q, bits, q, _mm512_set1_epi8(0x10));
            cw = type == HK_Q5_0 ? _mm_mul_ps(dw, _mm_set1_ps(-16.0f)) : pair_f16(b0 + 2, b1 + 2);
            break;
        }
        case HK_IQ4_NL: /* table values plus 128 (dpbusd does not saturate), the -128 through the block sums */
            q = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_xor_si128(loadu128(hk_kvalues_iq4nl), _mm_set1_epi8((char)0x80))),
                                    pair_nibbles(b0 + 2, b1 + 2));
            cw = _mm_mul_ps(dw, _mm_set1_ps(-128.0f));
            break;
        case HK_MXFP4: /* doubled e2m1 values plus 12, as in block32 */
            q = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_add_epi8(loadu128(hk_kvalues_mxfp4), _mm_set1_epi8(12))),
                                    pair_nibbles(b0 + 1, b1 + 1));
            cw = _mm_mul_ps(dw, _mm_set1_ps(-12.0f));
            break;
        default: { /* Q8_0: |w| times the activation with w's sign */
            __m512i s = _mm512_inserti64x4(_mm512_castsi256_si512(loadu256(b0 + 2)), loadu256(b1 + 2), 1);
            neg = _mm512_movepi8_mask(s);
            q = _mm512_abs_epi8(s);
            break;
        }
        }
        HK_UNROLL for (int t = 0; t < nt; t++) {
            __m512i av = _mm512_loadu_si512(a[t].qs + b * HK_QK);
            if (type == HK_Q8_0) av = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
            __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, av);
            __m512 scale = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_mul_ps(dw, load2(a[t].d + b))));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[t]);
            if (type != HK_Q8_0) corr[t] = _mm_fmadd_ps(cw, load2(a[t].ds + b), corr[t]);
        }
    }
    if (b < nb) block32(type, w + (size_t)b * ts, b, a, nt, tail, tail_corr);
    HK_UNROLL for (int t = 0; t < nt; t++) {
        __m128 c = _mm_add_ss(corr[t], _mm_movehdup_ps(corr[t]));
        out[t * os] = _mm512_reduce_add_ps(acc[t]) + hsum_ps(tail[t]) + (_mm_cvtss_f32(c) + tail_corr[t]);
    }
}

#define DOT32X2(name, type)                                                                                  \
    INLINE void name##_nt(int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) { \
        dot32x2_nt(type, nb, w, a, nt, out, os);                                                             \
    }                                                                                                        \
    NT_DISPATCH(name)

DOT32X2(dot512_q4_0, HK_Q4_0)
DOT32X2(dot512_q4_1, HK_Q4_1)
DOT32X2(dot512_q5_0, HK_Q5_0)
DOT32X2(dot512_q5_1, HK_Q5_1)
DOT32X2(dot512_q8_0, HK_Q8_0)
DOT32X2(dot512_iq4_nl, HK_IQ4_NL)
DOT32X2(dot512_mxfp4, HK_MXFP4)

/* -- 16 rows at once for Q4_0, Q4_1 and Q8_0: one lane per row, so a token's activation word is broadcast to
   every row and each of its scale products serves 16 rows. The rows' bytes are transposed in registers (no
   repacked copy of the weights); the per-row arithmetic is the same for every tile width, so a batched
   decode gives each sequence the logits it would get alone. */

/* Four 32-bit words at p + r * stride for rows r = 0..15, transposed: word k of row r in lane r of t[k]. */
INLINE void rows16_words(const uint8_t *p, ptrdiff_t stride, __m512i t[4]) {
    __m512i z[4];
    for (int j = 0; j < 4; j++) { /* z[j]: rows j, j + 4, j + 8, j + 12 in its four 128-bit lanes */
        __m512i v = _mm512_castsi128_si512(loadu128(p + j * stride));
        v = _mm512_inserti32x4(v, loadu128(p + (j + 4) * stride), 1);
        v = _mm512_inserti32x4(v, loadu128(p + (j + 8) * stride), 2);
        z[j] = _mm512_inserti32x4(v, loadu128(p + (j + 12) * stride), 3);
    }
    __m512i a = _mm512_unpacklo_epi32(z[0], z[1]), b = _mm512_unpackhi_epi32(z[0], z[1]);
    __m512i c = _mm512_unpacklo_epi32(z[2], z[3]), d = _mm512_unpackhi_epi32(z[2], z[3]);
    t[0] = _mm512_unpacklo_epi64(a, c);
    t[1] = _mm512_unpackhi_epi64(a, c);
    t[2] = _mm512_unpacklo_epi64(b, d);
    t[3] = _mm512_unpackhi_epi64(b, d);
}

/* hk_e8m0_half of the low byte of each lane. */
INLINE __m512 e8m0_half16(__m512i v) {
    __m512i e = _mm512_and_si512(v, _mm512_set1_epi32(0xFF));
    __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2)), normal, subnormal));
}

INLINE __m512i bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* out[t * os + r] = row r . a[t] for 16 rows stride bytes apart. Codes are unsigned bytes in q[k] (lane r:
   elements 4k..4k+3 of row r's block); the offset (Q4_0's -8, Q4_1's min, Q8_0's -128 after its signed
   bytes are flipped to w + 128, and the table types' -128 or -12 after their look-up plus that much) goes
   through the activations' block sums, as in dot32x2_nt. */
/* Decode block blk of 16 rows: q[k] the codes of elements 4k..4k+3 (0-15 low, 16-31 high for the nibble types)
   in each row's lane, dw the rows' scales and cw their offsets (see rows16_nt). */
INLINE void block16_decode(const int type, const uint8_t *blk, ptrdiff_t stride, __m512i offsets, __m512i *q, __m512 *dw, __m512 *cw) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i table = type == HK_IQ4_NL ? _mm512_broadcast_i32x4(_mm_xor_si128(loadu128(hk_kvalues_iq4nl), _mm_set1_epi8((char)0x80)))
                                            : _mm512_broadcast_i32x4(_mm_add_epi8(loadu128(hk_kvalues_mxfp4), _mm_set1_epi8(12)));
    __m512i head = _mm512_i32gather_epi32(offsets, blk, 1), words[4]; /* head: each row's d (and m) */
    *dw = type == HK_MXFP4 ? e8m0_half16(head) : _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
    const float off = type == HK_Q8_0 || type == HK_IQ4_NL ? -128.0f : type == HK_MXFP4 ? -12.0f : -8.0f;
    *cw = type == HK_Q4_1 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16))) : _mm512_mul_ps(*dw, _mm512_set1_ps(off));
    if (type == HK_Q8_0) { /* signed bytes to unsigned codes w + 128, elements 0-15 then 16-31 */
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        rows16_words(blk + 2, stride, words);
        for (int k = 0; k < 4; k++) q[k] = _mm512_xor_si512(words[k], flip);
        rows16_words(blk + 18, stride, words);
        for (int k = 0; k < 4; k++) q[k + 4] = _mm512_xor_si512(words[k], flip);
    } else {
        rows16_words(blk + (type == HK_Q4_1 ? 4 : type == HK_MXFP4 ? 1 : 2), stride, words);
        for (int k = 0; k < 4; k++) {
            q[k] = _mm512_and_si512(words[k], m4);                            /* elements 4k..4k+3 */
            q[k + 4] = _mm512_and_si512(_mm512_srli_epi32(words[k], 4), m4); /* 16 + 4k..16 + 4k + 3 */
        }
        if (type == HK_IQ4_NL || type == HK_MXFP4)
            for (int k = 0; k < 8; k++) q[k] = _mm512_shuffle_epi8(table, q[k]);
    }
}

/* One decoded block b against a token's activations: acc + its products (the same steps in every kernel). */
INLINE __m512 block16_token(const __m512i *q, __m512 dw, __m512 cw, int b, const hk_act *at, __m512 acc) {
    const int8_t *aq = at->qs + b * HK_QK;
    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
        even = _mm512_dpbusd_epi32(even, _mm512_load_si512(q + k), bcast32(aq + 4 * k));
        odd = _mm512_dpbusd_epi32(odd, _mm512_load_si512(q + k + 1), bcast32(aq + 4 * k + 4));
    }
    __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
    acc = _mm512_fmadd_ps(sum, _mm512_mul_ps(dw, _mm512_set1_ps(at->d[b])), acc);
    return _mm512_fmadd_ps(cw, _mm512_set1_ps(at->ds[b]), acc);
}

/* out[t * os + r] = row r . a[t] for 16 rows stride bytes apart. Codes are unsigned bytes in q[k] (lane r:
   elements 4k..4k+3 of row r's block); the offset (Q4_0's -8, Q4_1's min, Q8_0's -128 after its signed
   bytes are flipped to w + 128, and the table types' -128 or -12 after their look-up plus that much) goes
   through the activations' block sums, as in dot32x2_nt. */
INLINE void rows16_nt(const int type, int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, const int nt,
                      float *out, ptrdiff_t os) {
    const int ts = size32(type);
    const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)stride));
    __m512 acc[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    /* 16 interleaved streams are more than the hardware prefetcher follows: the next 16 rows (the next
       stretch of memory when rows are contiguous) are fetched into L2 while these compute, a few lines a
       block. Prefetching each row's lines ahead into L1 as well measured slower. */
    const char *next = (const char *)w + 16 * stride;
    const size_t next_lines = ((size_t)16 * stride + 63) / 64;
    size_t line = 0;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * ts;
        for (const size_t end = (size_t)(b + 1) * next_lines / nb; line < end; line++) _mm_prefetch(next + 64 * line, _MM_HINT_T1);
        __m512i q[8] __attribute__((aligned(64)));
        __m512 dw, cw;
        block16_decode(type, blk, stride, offsets, q, &dw, &cw);
        HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = block16_token(q, dw, cw, b, &a[t], acc[t]);
    }
    HK_UNROLL for (int t = 0; t < nt; t++) _mm512_storeu_ps(out + t * os, acc[t]);
}

#define ROWS16(name, type)                                                                                   \
    static void name(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os) { \
        switch (nt) {                                                                                        \
        case 1: rows16_nt(type, nb, w, stride, a, 1, out, os); break;                                        \
        case 2: rows16_nt(type, nb, w, stride, a, 2, out, os); break;                                        \
        case 3: rows16_nt(type, nb, w, stride, a, 3, out, os); break;                                        \
        case 4: rows16_nt(type, nb, w, stride, a, 4, out, os); break;                                        \
        case 5: rows16_nt(type, nb, w, stride, a, 5, out, os); break;                                        \
        case 6: rows16_nt(type, nb, w, stride, a, 6, out, os); break;                                        \
        case 7: rows16_nt(type, nb, w, stride, a, 7, out, os); break;                                        \
        case 8: rows16_nt(type, nb, w, stride, a, 8, out, os); break;                                        \
        default: break;                                                                                      \
        }                                                                                                    \
    }

ROWS16(rows16_q4_0, HK_Q4_0)
ROWS16(rows16_q4_1, HK_Q4_1)
ROWS16(rows16_q8_0, HK_Q8_0)
ROWS16(rows16_iq4_nl, HK_IQ4_NL)
ROWS16(rows16_mxfp4, HK_MXFP4)

/* -- 16 rows at once for Q4_K and Q6_K, as rows16_nt: each row's codes transposed into its lane, a token's
   four activation bytes broadcast to every row, and one vpdpbusd per 4 elements of 16 rows. A sub-block's
   integer sum is multiplied by its scale in int32 (exact), so only the per-super-block float steps round:
   the same for every tile width. */

/* Byte i of each lane, zero-extended. */
INLINE __m512i sc_byte(__m512i v, int i) { return _mm512_and_si512(_mm512_srli_epi32(v, 8 * i), _mm512_set1_epi32(0xFF)); }

/* Sub-block scale j (0..7) and min j of 16 Q4_K rows as int32 lanes, from their 12 scale bytes (see
   hk_unpack_k4_scales); mins as int16 pairs (2p, 2p + 1) for vpdpwssd against paired block sums. */
INLINE void k4_scales16(const uint8_t *s, __m512i offsets, __m512i sc[8], __m512i mn_pairs[4]) {
    __m512i a0 = _mm512_i32gather_epi32(offsets, s, 1), a1 = _mm512_i32gather_epi32(offsets, s + 4, 1);
    __m512i a2 = _mm512_i32gather_epi32(offsets, s + 8, 1);
    const __m512i m6 = _mm512_set1_epi32(0x3F3F3F3F), m4 = _mm512_set1_epi32(0x0F0F0F0F), top = _mm512_set1_epi32(0x30303030);
    __m512i w[4] = {_mm512_and_si512(a0, m6), _mm512_or_si512(_mm512_and_si512(a2, m4), _mm512_and_si512(_mm512_srli_epi32(a0, 2), top)),
                    _mm512_and_si512(a1, m6), _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a2, 4), m4), _mm512_and_si512(_mm512_srli_epi32(a1, 2), top))};
    for (int j = 0; j < 8; j++) sc[j] = sc_byte(w[j / 4], j % 4);
    for (int p = 0; p < 4; p++) /* mins 2p and 2p + 1 */
        mn_pairs[p] = _mm512_or_si512(sc_byte(w[2 + p / 2], 2 * (p % 2)), _mm512_slli_epi32(sc_byte(w[2 + p / 2], 2 * (p % 2) + 1), 16));
}

/* A token's block sums of one super-block summed over pairs of 16 (one per 32-element sub-block j), as
   int16 pairs (j = 2p, 2p + 1) in 32-bit words. */
INLINE void sub_sums32(const int16_t *bs, int32_t out[4]) {
    for (int p = 0; p < 4; p++) {
        int lo = bs[4 * p] + bs[4 * p + 1], hi = bs[4 * p + 2] + bs[4 * p + 3];
        out[p] = (int32_t)((uint32_t)(uint16_t)lo | ((uint32_t)(uint16_t)hi << 16));
    }
}

/* One token group (nt <= 8) of a decoded Q4_K super-block of 16 rows: q[16c + 8h + k] holds the codes of
   sub-block 2c + h, elements 4k..4k+3, in each row's lane. acc (16 floats at out + t * os) starts at zero
   on the first super-block and is read back after. */
INLINE void q4_k_tokens(const __m512i *q, const __m512i *sc, const __m512i *mn, __m512 dw, __m512 dm, int b,
                        const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    __m512i isum[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_setzero_si512();
    for (int j = 0; j < 8; j++) { /* sub-block j = 2c + h: elements 64c + 32h .. + 31 */
        __m512i sum[HK_MAX_NT];
        HK_UNROLL for (int t = 0; t < nt; t++) sum[t] = _mm512_setzero_si512();
        HK_UNROLL for (int k = 0; k < 8; k++) {
            const __m512i qk = _mm512_load_si512(q + 8 * j + k);
            HK_UNROLL for (int t = 0; t < nt; t++) sum[t] = _mm512_dpbusd_epi32(sum[t], qk, bcast32(a[t].qs + 256 * b + 32 * j + 4 * k));
        }
        HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(sum[t], _mm512_load_si512(sc + j)));
    }
    HK_UNROLL for (int t = 0; t < nt; t++) {
        int32_t pairs[4];
        sub_sums32(a[t].bsums + 16 * b, pairs);
        __m512i msum = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) msum = _mm512_dpwssd_epi32(msum, _mm512_load_si512(mn + p), _mm512_set1_epi32(pairs[p]));
        __m512 da = _mm512_set1_ps(a[t].d[b]), acc = b ? _mm512_loadu_ps(out + t * os) : _mm512_setzero_ps();
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, da), acc);
        _mm512_storeu_ps(out + t * os, _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dm, da), acc));
    }
}

/* The token loop of a 16-row kernel: groups of 8, the last group's size dispatched to an unrolled body. */
#define TOKEN_GROUPS(body, ...)                                                                              \
    for (int t0 = 0; t0 < n; t0 += 8) {                                                                      \
        const hk_act *at = a + t0;                                                                           \
        float *ot = out + (ptrdiff_t)t0 * os;                                                                \
        switch (n - t0 < 8 ? n - t0 : 8) {                                                                   \
        case 1: body(__VA_ARGS__, at, 1, ot, os); break;                                                     \
        case 2: body(__VA_ARGS__, at, 2, ot, os); break;                                                     \
        case 3: body(__VA_ARGS__, at, 3, ot, os); break;                                                     \
        case 4: body(__VA_ARGS__, at, 4, ot, os); break;                                                     \
        case 5: body(__VA_ARGS__, at, 5, ot, os); break;                                                     \
        case 6: body(__VA_ARGS__, at, 6, ot, os); break;                                                     \
        case 7: body(__VA_ARGS__, at, 7, ot, os); break;                                                     \
        default: body(__VA_ARGS__, at, 8, ot, os); break;                                                    \
        }                                                                                                    \
    }

/* The L2 prefetch of the next 16 rows, spread over the super-blocks (see rows16_nt). */
INLINE void prefetch_next_rows(const uint8_t *w, ptrdiff_t stride, int b, int nb, size_t *line) {
    const char *next = (const char *)w + 16 * stride;
    const size_t next_lines = ((size_t)16 * stride + 63) / 64;
    for (const size_t end = (size_t)(b + 1) * next_lines / nb; *line < end; (*line)++) _mm_prefetch(next + 64 * *line, _MM_HINT_T1);
}

INLINE __m512i row_offsets(ptrdiff_t stride) {
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32((int)stride));
}

#define GROUP_BLOCKS 8 /* legacy blocks decoded at a time by gemm16_32: 8 x 32 elements of 16 rows */

/* One token group against up to GROUP_BLOCKS decoded blocks from b0; acc (16 floats at out + t * os) starts
   at zero on the first block and is read back after, so each result is rows16_nt's. */
INLINE void blocks16_tokens(const __m512i *q, const __m512 *dw, const __m512 *cw, int b0, int nbb, const hk_act *a,
                            const int nt, float *out, ptrdiff_t os) {
    __m512 acc[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = b0 ? _mm512_loadu_ps(out + t * os) : _mm512_setzero_ps();
    for (int j = 0; j < nbb; j++)
        HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = block16_token(q + 8 * j, dw[j], cw[j], b0 + j, &a[t], acc[t]);
    HK_UNROLL for (int t = 0; t < nt; t++) _mm512_storeu_ps(out + t * os, acc[t]);
}

INLINE void gemm16_32(const int type, int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, float *out, ptrdiff_t os) {
    const int ts = size32(type);
    const __m512i offsets = row_offsets(stride);
    __m512i q[8 * GROUP_BLOCKS] __attribute__((aligned(64)));
    __m512 dw[GROUP_BLOCKS], cw[GROUP_BLOCKS];
    size_t line = 0;
    for (int b0 = 0; b0 < nb; b0 += GROUP_BLOCKS) {
        const int nbb = nb - b0 < GROUP_BLOCKS ? nb - b0 : GROUP_BLOCKS;
        for (int j = 0; j < nbb; j++) {
            prefetch_next_rows(w, stride, b0 + j, nb, &line);
            block16_decode(type, w + (size_t)(b0 + j) * ts, stride, offsets, q + 8 * j, &dw[j], &cw[j]);
        }
        TOKEN_GROUPS(blocks16_tokens, q, dw, cw, b0, nbb)
    }
}

#define GEMM16_32(name, type)                                                                                \
    static void name(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, float *out, ptrdiff_t os) { \
        gemm16_32(type, nb, w, stride, a, n, out, os);                                                       \
    }

GEMM16_32(gemm16_q4_0, HK_Q4_0)
GEMM16_32(gemm16_q4_1, HK_Q4_1)
GEMM16_32(gemm16_q8_0, HK_Q8_0)
GEMM16_32(gemm16_iq4_nl, HK_IQ4_NL)
GEMM16_32(gemm16_mxfp4, HK_MXFP4)

static void gemm16_q4_k(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, float *out, ptrdiff_t os) {
    const __m512i offsets = row_offsets(stride), m4 = _mm512_set1_epi8(0x0F);
    __m512i q[64] __attribute__((aligned(64))), sc[8] __attribute__((aligned(64))), mn[4] __attribute__((aligned(64)));
    size_t line = 0;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 144;
        prefetch_next_rows(w, stride, b, nb, &line);
        __m512i head = _mm512_i32gather_epi32(offsets, blk, 1);
        __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)), dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)));
        k4_scales16(blk + 4, offsets, sc, mn);
        for (int c = 0; c < 4; c++) {
            __m512i words[8];
            rows16_words(blk + 16 + 32 * c, stride, words);
            rows16_words(blk + 32 + 32 * c, stride, words + 4);
            for (int k = 0; k < 8; k++) { /* low nibbles: sub-block 2c; high nibbles: 2c + 1 */
                q[16 * c + k] = _mm512_and_si512(words[k], m4);
                q[16 * c + 8 + k] = _mm512_and_si512(_mm512_srli_epi32(words[k], 4), m4);
            }
        }
        TOKEN_GROUPS(q4_k_tokens, q, sc, mn, dw, dm, b)
    }
}

/* One token group of a decoded Q6_K super-block of 16 rows: q[4s + k] holds the codes (0..63) of the
   16-element sub-block s, elements 4k..4k+3; sc[s] its scale, sc_pairs[p] scales 2p and 2p + 1 as int16. */
INLINE void q6_k_tokens(const __m512i *q, const __m512i *sc, const __m512i *sc_pairs, __m512 dw, int b,
                        const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    __m512i isum[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) { /* the -32 offset: -32 * sum(scale * bsum) */
        int32_t bs[8]; /* block sums 2p and 2p + 1 as one int16 pair */
        memcpy(bs, a[t].bsums + 16 * b, sizeof bs);
        __m512i corr = _mm512_setzero_si512();
        for (int p = 0; p < 8; p++) corr = _mm512_dpwssd_epi32(corr, _mm512_load_si512(sc_pairs + p), _mm512_set1_epi32(bs[p]));
        isum[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(corr, 5));
    }
    for (int s = 0; s < 16; s++) {
        __m512i sum[HK_MAX_NT];
        HK_UNROLL for (int t = 0; t < nt; t++) sum[t] = _mm512_setzero_si512();
        HK_UNROLL for (int k = 0; k < 4; k++) {
            const __m512i qk = _mm512_load_si512(q + 4 * s + k);
            HK_UNROLL for (int t = 0; t < nt; t++) sum[t] = _mm512_dpbusd_epi32(sum[t], qk, bcast32(a[t].qs + 256 * b + 16 * s + 4 * k));
        }
        HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(sum[t], _mm512_load_si512(sc + s)));
    }
    HK_UNROLL for (int t = 0; t < nt; t++) {
        __m512 acc = b ? _mm512_loadu_ps(out + t * os) : _mm512_setzero_ps();
        _mm512_storeu_ps(out + t * os, _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, _mm512_set1_ps(a[t].d[b])), acc));
    }
}

static void gemm16_q6_k(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, float *out, ptrdiff_t os) {
    const __m512i offsets = row_offsets(stride), m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512i q[64] __attribute__((aligned(64))), sc[16] __attribute__((aligned(64))), sc_pairs[8] __attribute__((aligned(64)));
    size_t line = 0;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 210;
        prefetch_next_rows(w, stride, b, nb, &line);
        /* d is bytes 208-209: gathered from 206 so no lane reads past the block */
        __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_i32gather_epi32(offsets, blk + 206, 1), 16)));
        __m512i scw[4];
        rows16_words(blk + 192, stride, scw); /* lane r of scw[k]: row r's scales 4k..4k+3 */
        for (int s = 0; s < 16; s++) sc[s] = _mm512_srai_epi32(_mm512_slli_epi32(scw[s / 4], 24 - 8 * (s % 4)), 24);
        for (int p = 0; p < 8; p++)
            sc_pairs[p] = _mm512_or_si512(_mm512_and_si512(sc[2 * p], _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(sc[2 * p + 1], 16));
        HK_UNROLL for (int h = 0; h < 2; h++)
            HK_UNROLL for (int e = 0; e < 2; e++) { /* 16 elements of each quarter i: sub-block 8h + 2i + e */
                __m512i ql0[4], ql1[4], qh[4];
                rows16_words(blk + 64 * h + 16 * e, stride, ql0);
                rows16_words(blk + 64 * h + 32 + 16 * e, stride, ql1);
                rows16_words(blk + 128 + 32 * h + 16 * e, stride, qh);
                __m512i *qs = q + 4 * (8 * h + e);
                HK_UNROLL for (int k = 0; k < 4; k++) {
                    qs[k] = _mm512_or_si512(_mm512_and_si512(ql0[k], m4), _mm512_and_si512(_mm512_slli_epi32(qh[k], 4), m30));
                    qs[8 + k] = _mm512_or_si512(_mm512_and_si512(ql1[k], m4), _mm512_and_si512(_mm512_slli_epi32(qh[k], 2), m30));
                    qs[16 + k] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(ql0[k], 4), m4), _mm512_and_si512(qh[k], m30));
                    qs[24 + k] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(ql1[k], 4), m4), _mm512_and_si512(_mm512_srli_epi32(qh[k], 2), m30));
                }
            }
        TOKEN_GROUPS(q6_k_tokens, q, sc, sc_pairs, dw, b)
    }
}

/* -- Q4_K and Q5_K with one 64-element chunk (two sub-blocks) per 512-bit vector */

/* int16 lanes 0-15 equal to byte i of the k4_scales vector, lanes 16-31 to byte i + 1. */
INLINE __m512i k4_scale_pair512(__m512i sc, int i) {
    const short lo = (short)(0x8000 | i), hi = (short)(0x8000 | (i + 1));
    return _mm512_shuffle_epi8(sc, _mm512_set_epi16(hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi,
                                                    lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo));
}

/* A one-row K-quant kernel's step at the end of super-block b: the exact integer totals, then the float
   steps of the 16-row kernels (q4_k_tokens, q6_k_tokens) in the same order, so a row's product is the same
   bits whichever kernel computes it. */
INLINE void k_exact(const hk_act *a, int b, const int nt, const __m256i *isum, const __m256i *msum, float dw, float dm, float *acc) {
    HK_UNROLL for (int t = 0; t < nt; t++) {
        float da = a[t].d[b];
        if (!msum) {
            acc[t] = fmaf((float)hsum_epi32(isum[t]), dw * da, acc[t]);
            continue;
        }
        /* both totals in one reduction: lanes 0 and 1 of z */
        __m256i x = _mm256_hadd_epi32(isum[t], msum[t]); /* i01 i23 m01 m23 | i45 i67 m45 m67 */
        __m128i y = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
        __m128i z = _mm_add_epi32(y, _mm_shuffle_epi32(y, _MM_SHUFFLE(3, 3, 3, 1)));
        acc[t] = fmaf((float)_mm_cvtsi128_si32(z), dw * da, acc[t]);
        acc[t] = fmaf(-(float)_mm_extract_epi32(z, 2), dm * da, acc[t]);
    }
}

INLINE void dot512_q45_k_nt(const int five, int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m256i m16 = _mm256_set1_epi8(0x10);
    const int ts = five ? 176 : 144;
    float acc[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * ts, *qs = blk + (five ? 48 : 16);
        __m256i sc = k4_scales(blk + 4), mins16 = k4_mins_pairs(sc), qh = five ? loadu256(blk + 16) : _mm256_setzero_si256();
        __m512i sc512 = _mm512_broadcast_i64x4(sc);
        __m512i isum[HK_MAX_NT];
        __m256i isum256[HK_MAX_NT], msum256[HK_MAX_NT];
        HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            __m256i raw = loadu256(qs + 32 * c);
            __m512i q = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1), m4);
            if (five) { /* bit 2c (2c+1) of each qh byte is bit 4 of the low (high) nibble's code, as in dot_q5_k */
                __m256i hlo = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * c), 4), m16);
                __m256i hhi = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * c + 1), 4), m16);
                q = _mm512_or_si512(q, _mm512_inserti64x4(_mm512_castsi256_si512(hlo), hhi, 1));
            }
            __m512i s = k4_scale_pair512(sc512, 2 * c);
            HK_UNROLL for (int t = 0; t < nt; t++)
                isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(q, _mm512_loadu_si512(a[t].qs + 256 * b + 64 * c)), s);
        }
        HK_UNROLL for (int t = 0; t < nt; t++) {
            isum256[t] = _mm256_add_epi32(_mm512_castsi512_si256(isum[t]), _mm512_extracti64x4_epi64(isum[t], 1));
            msum256[t] = _mm256_madd_epi16(bsums_of(&a[t], b), mins16);
        }
        k_exact(a, b, nt, isum256, msum256, f16x(blk), f16x(blk + 2), acc);
    }
    HK_UNROLL for (int t = 0; t < nt; t++) out[t * os] = acc[t];
}
INLINE void dot512_q4_k_nt(int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    dot512_q45_k_nt(0, nb, w, a, nt, out, os);
}
NT_DISPATCH(dot512_q4_k)

INLINE void dot512_q5_k_nt(int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    dot512_q45_k_nt(1, nb, w, a, nt, out, os);
}
NT_DISPATCH(dot512_q5_k)

/* Q6_K one row at a time with k_exact's ending (dot_q6_k_nt's arithmetic otherwise). */
INLINE void dot512_q6_k_nt(int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    float acc[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 210;
        __m128i sc8 = loadu128(blk + 192);
        __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        __m256i isum[HK_MAX_NT];
        HK_UNROLL for (int t = 0; t < nt; t++) /* the -32 offset: -32 * sum(scale * bsum) */
            isum[t] = _mm256_slli_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(bsums_of(&a[t], b), sc16)), 5);
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = loadu256(blk + 64 * h), ql1 = loadu256(blk + 64 * h + 32), qh = loadu256(blk + 128 + 32 * h);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            for (int i = 0; i < 4; i++) {
                __m256i s = scale_pair(sc8, 4 * h + i);
                HK_UNROLL for (int t = 0; t < nt; t++)
                    isum[t] = madd_acc(isum[t], _mm256_maddubs_epi16(q[i], loadu256(a[t].qs + 256 * b + 128 * h + 32 * i)), s);
            }
        }
        k_exact(a, b, nt, isum, NULL, f16x(blk + 208), 0.0f, acc);
    }
    HK_UNROLL for (int t = 0; t < nt; t++) out[t * os] = acc[t];
}
NT_DISPATCH(dot512_q6_k)

/* -- IQ4_XS with two 32-element sub-blocks per 512-bit vector: the table values' magnitudes against the
   activations negated where a value is negative (no vpsignb in AVX-512), int16 pairs times each sub-block's scale */

INLINE void dot512_iq4_xs_nt(int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    const __m512i table = _mm512_broadcast_i32x4(loadu128(hk_kvalues_iq4nl)), m4 = _mm512_set1_epi8(0x0F);
    __m256 acc[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 136;
        const unsigned sh = hk_u16(blk + 2);
        __m512i isum[HK_MAX_NT];
        __m256i isum256[HK_MAX_NT];
        HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) { /* sub-blocks 2c and 2c + 1: 32 bytes of codes, elements 64c .. 64c + 63 */
            __m256i raw = loadu256(blk + 8 + 32 * c);
            __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
            __m512i v = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), m4));
            __m512i uv = _mm512_abs_epi8(v);
            __mmask64 neg = _mm512_movepi8_mask(v);
            int ls[2];
            for (int k = 0; k < 2; k++) {
                const int ib = 2 * c + k;
                ls[k] = (((blk[4 + c] >> (4 * k)) & 0xF) | (((sh >> (2 * ib)) & 3) << 4)) - 32;
            }
            __m512i scale = _mm512_inserti64x4(_mm512_set1_epi16((short)ls[0]), _mm256_set1_epi16((short)ls[1]), 1);
            HK_UNROLL for (int t = 0; t < nt; t++) {
                __m512i av = _mm512_loadu_si512(a[t].qs + 256 * b + 64 * c);
                av = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
                isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(uv, av), scale);
            }
        }
        HK_UNROLL for (int t = 0; t < nt; t++)
            isum256[t] = _mm256_add_epi32(_mm512_castsi512_si256(isum[t]), _mm512_extracti64x4_epi64(isum[t], 1));
        k_accumulate(a, b, nt, isum256, NULL, f16x(blk), 0.0f, acc);
    }
    k_store(acc, nt, out, os);
}
NT_DISPATCH(dot512_iq4_xs)

const hk_isa hk_isa_avx512 = {
    .name = "avx512",
    .dot = {
        [HK_F32] = FN(dot_f32), [HK_F16] = FN(dot_f16), [HK_BF16] = FN(dot_bf16), [HK_Q4_0] = FN(dot512_q4_0),
        [HK_Q4_1] = FN(dot512_q4_1), [HK_Q5_0] = FN(dot512_q5_0), [HK_Q5_1] = FN(dot512_q5_1), [HK_Q8_0] = FN(dot512_q8_0),
        [HK_Q2_K] = FN(dot_q2_k), [HK_Q3_K] = FN(dot_q3_k), [HK_Q4_K] = FN(dot512_q4_k), [HK_Q5_K] = FN(dot512_q5_k),
        [HK_Q6_K] = FN(dot512_q6_k), [HK_TQ1_0] = FN(dot_tq1_0), [HK_TQ2_0] = FN(dot_tq2_0),
        [HK_IQ4_NL] = FN(dot512_iq4_nl), [HK_MXFP4] = FN(dot512_mxfp4), [HK_IQ4_XS] = FN(dot512_iq4_xs),
        [HK_IQ2_XXS] = FN(dot_iq2_xxs), [HK_IQ2_XS] = FN(dot_iq2_xs), [HK_IQ2_S] = FN(dot_iq2_s),
        [HK_IQ3_XXS] = FN(dot_iq3_xxs), [HK_IQ3_S] = FN(dot_iq3_s),
    },
    .dot16 = {[HK_Q4_0] = rows16_q4_0, [HK_Q4_1] = rows16_q4_1, [HK_Q8_0] = rows16_q8_0, [HK_IQ4_NL] = rows16_iq4_nl,
              [HK_MXFP4] = rows16_mxfp4, },
    .gemm16 = {[HK_Q4_K] = gemm16_q4_k, [HK_Q6_K] = gemm16_q6_k, [HK_Q4_0] = gemm16_q4_0, [HK_Q4_1] = gemm16_q4_1,
               [HK_Q8_0] = gemm16_q8_0, [HK_IQ4_NL] = gemm16_iq4_nl, [HK_MXFP4] = gemm16_mxfp4},
    .tile = { /* 8 tokens where it measured faster than 4 (64-token products, one thread) */
        [HK_Q4_0] = 8, [HK_Q4_1] = 8, [HK_Q5_0] = 8, [HK_Q5_1] = 8, [HK_Q4_K] = 8, [HK_Q5_K] = 8, [HK_TQ1_0] = 8,
        [HK_TQ2_0] = 8, [HK_Q6_K] = 8,
    },
    .quant32 = FN(quant32),
    .quantK = FN(quantK),
};

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
