/* AVX-512 (F, BW, VL, VNNI) kernels: 512-bit versions of the hot types; the rest are the 256-bit kernels
   compiled with the EVEX-encoded VNNI dot products. */
#include "hk.h"

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

/* The 16-row kernels (rows in vector lanes) are in kernels_avx512_rows16.c. */
#define HK_ROWS16_DECL(t)                                                                                    \
    void hk_rows16_##t(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os); \
    void hk_gemm16_##t(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, float *out, ptrdiff_t os);
HK_ROWS16_DECL(q4_0)
HK_ROWS16_DECL(q4_1)
HK_ROWS16_DECL(q5_0)
HK_ROWS16_DECL(q5_1)
HK_ROWS16_DECL(q8_0)
HK_ROWS16_DECL(iq4_nl)
HK_ROWS16_DECL(mxfp4)
HK_ROWS16_DECL(q4_0_r16)
HK_ROWS16_DECL(iq4_nl_r16)
HK_ROWS16_DECL(q4_k_r16)
HK_ROWS16_DECL(q8_0_r16)
HK_ROWS16_DECL(q6_k_r16)
void hk_gemm16_q4_k(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, float *out, ptrdiff_t os);
void hk_gemm16_q6_k(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, float *out, ptrdiff_t os);
void hk_gemm16_q4_k_r16(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, float *out, ptrdiff_t os);

/* -- Q4_K and Q5_K with one 64-element chunk (two sub-blocks) per 512-bit vector. Each super-block's integer
   sums are added up exactly first, then one float step per token (k1_accumulate): the 16-row GEMM
   (kernels_avx512_rows16.c) takes the same steps with one row per lane, so their results are the same bits. */

/* The sums of the 8 lanes of i and of m, in lanes 0 and 1 (single-uop shuffles: no vphaddd). */
INLINE __m128i hsum2_epi32(__m256i i, __m256i m) {
    const __m256i h = _mm256_add_epi32(_mm256_unpacklo_epi32(i, m), _mm256_unpackhi_epi32(i, m));
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    return _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
}

/* acc (lane 0) += float(isum) * (dw * da) and accm (lane 1) += float(msum) * (dm * da), each one rounding
   (fused); dwm holds dw, dm in lanes 0, 1. The mins' products are summed apart and taken off at the end
   (as llama.cpp's kernels do). */
INLINE void k1_accumulate(const hk_act *a, int b, const int nt, const __m256i *isum, const __m256i *msum, __m128 dwm, __m128 *acc) {
    HK_UNROLL for (int t = 0; t < nt; t++)
        acc[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum2_epi32(isum[t], msum[t])), _mm_mul_ps(dwm, _mm_set1_ps(a[t].d[b])), acc[t]);
}

/* int16 lanes 0-15 equal to byte i of the k4_scales vector, lanes 16-31 to byte i + 1. */
INLINE __m512i k4_scale_pair512(__m512i sc, int i) {
    const short lo = (short)(0x8000 | i), hi = (short)(0x8000 | (i + 1));
    return _mm512_shuffle_epi8(sc, _mm512_set_epi16(hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi, hi,
                                                    lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo));
}

INLINE void dot512_q45_k_nt(const int five, int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m256i m16 = _mm256_set1_epi8(0x10);
    const int ts = five ? 176 : 144;
    __m128 acc[HK_MAX_NT]; /* lane 0: the sums, lane 1: the mins' */
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * ts, *qs = blk + (five ? 48 : 16);
        prefetch_ahead(blk, ts);
        __m256i sc = k4_scales(blk), mins16 = k4_mins_pairs(sc), qh = five ? loadu256(blk + 16) : _mm256_setzero_si256();
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
        k1_accumulate(a, b, nt, isum256, msum256, _mm_cvtph_ps(loadu128(blk)), acc); /* d, dmin in lanes 0, 1 */
    }
    HK_UNROLL for (int t = 0; t < nt; t++) out[t * os] = _mm_cvtss_f32(_mm_sub_ss(acc[t], _mm_movehdup_ps(acc[t])));
}
INLINE void dot512_q4_k_nt(int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    dot512_q45_k_nt(0, nb, w, a, nt, out, os);
}
NT_DISPATCH(dot512_q4_k)

INLINE void dot512_q5_k_nt(int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    dot512_q45_k_nt(1, nb, w, a, nt, out, os);
}
NT_DISPATCH(dot512_q5_k)

/* -- Q6_K: a super-block's integer lanes added up exactly, then one float step per token (the 16-row GEMM's,
   kernels_avx512_rows16.c) */

/* The integer lanes of a Q6_K super-block b against nt tokens, 64 elements per 512-bit vector: group g
   (elements 64g .. 64g + 63: bytes 64h.. of ql, low nibbles for g = 2h, high for 2h + 1; qh's 32 bytes at
   128 + 32h, shifted to bits 4-5 per 32-element quarter) times sub-block scales 4g .. 4g + 3 (sc16: the 16
   scales as int16, each picked for its 8 lanes by one vpermw). The lanes' sum, less 32 * sum(scale * bsum),
   is the super-block's exact integer dot, as q6_k_isum's (the float steps see only that sum). */
INLINE void q6_k_lanes512(const uint8_t *blk, const hk_act *a, int b, const int nt, __m256i sc16, __m512i *acc) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);   /* quarters 0, 1: bits 0-1, 2-3 */
    const __m512i down = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1); /* quarters 2, 3: bits 4-5, 6-7 */
    const __m512i sc = _mm512_castsi256_si512(sc16);
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_si512();
    HK_UNROLL for (int h = 0; h < 2; h++) {
        const __m512i ql = _mm512_loadu_si512(blk + 64 * h), qh = _mm512_broadcast_i64x4(loadu256(blk + 128 + 32 * h));
        HK_UNROLL for (int e = 0; e < 2; e++) {
            const short g = (short)(2 * h + e), s0 = 4 * g, s1 = s0 + 1, s2 = s0 + 2, s3 = s0 + 3;
            const __m512i lo = e ? _mm512_srli_epi16(ql, 4) : ql;
            const __m512i hi = e ? _mm512_srlv_epi16(qh, down) : _mm512_sllv_epi16(qh, up);
            const __m512i q = _mm512_or_si512(_mm512_and_si512(lo, m4), _mm512_and_si512(hi, m30));
            const __m512i sg = _mm512_permutexvar_epi16(_mm512_set_epi16(s3, s3, s3, s3, s3, s3, s3, s3, s2, s2, s2, s2, s2, s2, s2, s2,
                                                                         s1, s1, s1, s1, s1, s1, s1, s1, s0, s0, s0, s0, s0, s0, s0, s0), sc);
            HK_UNROLL for (int t = 0; t < nt; t++)
                acc[t] = _mm512_dpwssd_epi32(acc[t], _mm512_maddubs_epi16(q, _mm512_loadu_si512(a[t].qs + 256 * b + 64 * g)), sg);
        }
    }
}

INLINE __m256i q6_k_scales16(const uint8_t *blk) { return _mm256_cvtepi8_epi16(loadu128(blk + 192)); }

/* Super-blocks two at a time: their lanes summed in one pass (block b in the low 256 bits, b + 1 in the high),
   then the same float steps as one at a time, in the same order (so the same bits). */
INLINE void dot512_q6_k_nt(int nb, const uint8_t *w, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    __m128 acc[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm_setzero_ps();
    int b = 0;
    for (; b + 1 < nb; b += 2) {
        const uint8_t *blk = w + (size_t)b * 210;
        prefetch_ahead(blk, 420);
        const __m256i sc0 = q6_k_scales16(blk), sc1 = q6_k_scales16(blk + 210);
        const __m512i sc01 = _mm512_inserti64x4(_mm512_castsi256_si512(sc0), sc1, 1);
        const float dw0 = f16x(blk + 208), dw1 = f16x(blk + 418);
        __m512i l0[HK_MAX_NT], l1[HK_MAX_NT];
        q6_k_lanes512(blk, a, b, nt, sc0, l0);
        q6_k_lanes512(blk + 210, a, b + 1, nt, sc1, l1);
        HK_UNROLL for (int t = 0; t < nt; t++) {
            __m512i s = _mm512_add_epi32(_mm512_shuffle_i64x2(l0[t], l1[t], _MM_SHUFFLE(1, 0, 1, 0)),
                                         _mm512_shuffle_i64x2(l0[t], l1[t], _MM_SHUFFLE(3, 2, 3, 2)));
            s = _mm512_sub_epi32(s, _mm512_slli_epi32(_mm512_madd_epi16(_mm512_loadu_si512(a[t].bsums + 16 * b), sc01), 5));
            const __m128 f = _mm_cvtepi32_ps(hsum2_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1)));
            acc[t] = _mm_fmadd_ss(f, _mm_set_ss(dw0 * a[t].d[b]), acc[t]);
            acc[t] = _mm_fmadd_ss(_mm_movehdup_ps(f), _mm_set_ss(dw1 * a[t].d[b + 1]), acc[t]);
        }
    }
    if (b < nb) {
        const uint8_t *blk = w + (size_t)b * 210;
        const __m256i sc16 = q6_k_scales16(blk);
        const float dw = f16x(blk + 208);
        __m512i l[HK_MAX_NT];
        q6_k_lanes512(blk, a, b, nt, sc16, l);
        HK_UNROLL for (int t = 0; t < nt; t++) {
            const __m256i s = _mm256_sub_epi32(_mm256_add_epi32(_mm512_castsi512_si256(l[t]), _mm512_extracti64x4_epi64(l[t], 1)),
                                               _mm256_slli_epi32(_mm256_madd_epi16(bsums_of(&a[t], b), sc16), 5));
            acc[t] = _mm_fmadd_ss(_mm_cvtepi32_ps(hsum2_epi32(s, s)), _mm_set_ss(dw * a[t].d[b]), acc[t]);
        }
    }
    HK_UNROLL for (int t = 0; t < nt; t++) out[t * os] = _mm_cvtss_f32(acc[t]);
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
    .dot16 = {[HK_Q4_0] = hk_rows16_q4_0, [HK_Q4_1] = hk_rows16_q4_1, [HK_Q5_0] = hk_rows16_q5_0,
              [HK_Q5_1] = hk_rows16_q5_1, [HK_Q8_0] = hk_rows16_q8_0,
              [HK_IQ4_NL] = hk_rows16_iq4_nl, [HK_MXFP4] = hk_rows16_mxfp4,
              [HK_Q4_0_R16] = hk_rows16_q4_0_r16, [HK_IQ4_NL_R16] = hk_rows16_iq4_nl_r16,
              [HK_Q4_K_R16] = hk_rows16_q4_k_r16, [HK_Q8_0_R16] = hk_rows16_q8_0_r16, [HK_Q6_K_R16] = hk_rows16_q6_k_r16},
    .gemm16 = {[HK_Q4_0] = hk_gemm16_q4_0, [HK_Q4_1] = hk_gemm16_q4_1, [HK_Q5_0] = hk_gemm16_q5_0,
               [HK_Q5_1] = hk_gemm16_q5_1, [HK_Q8_0] = hk_gemm16_q8_0,
               [HK_IQ4_NL] = hk_gemm16_iq4_nl, [HK_MXFP4] = hk_gemm16_mxfp4, [HK_Q4_K] = hk_gemm16_q4_k,
               [HK_Q6_K] = hk_gemm16_q6_k, [HK_Q4_0_R16] = hk_gemm16_q4_0_r16, [HK_IQ4_NL_R16] = hk_gemm16_iq4_nl_r16,
               [HK_Q4_K_R16] = hk_gemm16_q4_k_r16, [HK_Q8_0_R16] = hk_gemm16_q8_0_r16, [HK_Q6_K_R16] = hk_gemm16_q6_k_r16},
    .tile = { /* 8 tokens where it measured faster than 4 (64-token products, one thread) */
        [HK_Q4_0] = 8, [HK_Q4_1] = 8, [HK_Q5_0] = 8, [HK_Q5_1] = 8, [HK_Q4_K] = 8, [HK_Q5_K] = 8, [HK_TQ1_0] = 8,
        [HK_TQ2_0] = 8, [HK_Q4_0_R16] = 8,
    },
    .quant32 = FN(quant32),
    .quantK = FN(quantK),
};

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
