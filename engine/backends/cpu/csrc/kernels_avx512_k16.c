/* AVX-512 (F, BW, VL, VNNI) kernels for 16 rows of Q4_K / Q6_K at once, one row per 32-bit lane: the GEMMs of
   the file layouts (the rows' bytes transposed in registers) and the 16-row layouts (HK_Q4_K_R16, HK_Q6_K_R16,
   their bytes already in lanes; a one-token kernel and a GEMM each). Every result is the same bits as the one-row
   kernel hk_dot_rows would otherwise run for that row (see hk.h), so which one runs is a matter of speed only. */
#include "hk.h"

#ifdef HK_X86
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

#define INLINE static inline __attribute__((always_inline))

#include "kernels_avx512_rows16.inc"

/* A 16-row layout's one-token kernel for nt <= HK_TILE tokens: each tile size dispatched to an unrolled body. */
#define ROWS16_NT(name, body)                                                                                \
    void hk_##name(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os) { \
        switch (nt) {                                                                                        \
        case 1: body(nb, w, stride, a, 1, out, os); break;                                                   \
        case 2: body(nb, w, stride, a, 2, out, os); break;                                                   \
        case 3: body(nb, w, stride, a, 3, out, os); break;                                                   \
        default: body(nb, w, stride, a, 4, out, os); break;                                                  \
        }                                                                                                    \
    }

/* -- Q4_K and Q6_K: 16 rows of a super-block transposed and decoded once for K1_TOKENS tokens. vpdpbusd sums
   a sub-block's codes times a token's activations (at most 32 * 15 * 127 or 16 * 63 * 127), times the
   sub-block's scale in int32 (vpmulld): each row's super-block is one exact integer (as in llama.cpp's
   repacked K-quant GEMMs), then a float step per row and token, with the Q4_K mins' products summed apart
   and taken off at the end. The one-row kernels (dot512_q4_k, dot512_q6_k) take the same float steps on
   the same integers, so a product is the same bits whichever kernel computes it. */

#define K1_TOKENS 64 /* tokens per pass (a whole GEMM tile): their 16-row sums stay in L1 */

/* A token's two block sums i, i + 1 of super-block b as one int16 pair in every lane. */
INLINE __m512i bsum_pair(const hk_act *at, int b, int i) {
    int32_t v;
    memcpy(&v, at->bsums + 16 * b + i, 4);
    return _mm512_set1_epi32(v);
}

/* The byte shuffle that puts byte i (0..3) of each 32-bit lane in its low byte, zeros above (pair: in both 16-bit
   halves, an int16 pair). */
INLINE __m512i lane_byte(int i, int pair) {
    int v[4];
    for (int k = 0; k < 4; k++) v[k] = (4 * k + i) | 0x80 << 8 | (pair ? 4 * k + i : 0x80) << 16 | 0x80 << 24;
    return _mm512_broadcast_i32x4(_mm_setr_epi32(v[0], v[1], v[2], v[3]));
}

/* Sub-block scale j (0..7) of 16 Q4_K rows as int32 lanes and min j as int16 pairs, from the three words of
   their 12 scale bytes (see hk_unpack_k4_scales; lane r: row r). */
INLINE void k4_scales16_of(__m512i a0, __m512i a1, __m512i a2, __m512i sc[8], __m512i mnp[8]) {
    const __m512i m6 = _mm512_set1_epi32(0x3F3F3F3F), m4 = _mm512_set1_epi32(0x0F0F0F0F), top = _mm512_set1_epi32(0x30303030);
    __m512i w[4] = {_mm512_and_si512(a0, m6), _mm512_or_si512(_mm512_and_si512(a2, m4), _mm512_and_si512(_mm512_srli_epi32(a0, 2), top)),
                    _mm512_and_si512(a1, m6), _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a2, 4), m4), _mm512_and_si512(_mm512_srli_epi32(a1, 2), top))};
    HK_UNROLL for (int j = 0; j < 8; j++) {
        sc[j] = _mm512_shuffle_epi8(w[j / 4], lane_byte(j % 4, 0));
        mnp[j] = _mm512_shuffle_epi8(w[2 + j / 4], lane_byte(j % 4, 1));
    }
}

/* A super-block's d, dmin (as floats), scales and mins of 16 rows: gathered from the file layout's rows
   (stride bytes apart, offsets their distances), or loaded from the 16-row layout's first four vectors. */
INLINE void k4_head16(const int r16, const uint8_t *blk, __m512i offsets, __m512 *dw, __m512 *dm, __m512i sc[8], __m512i mnp[8]) {
    __m512i head, a[3];
    if (r16) {
        head = _mm512_loadu_si512(blk);
        for (int k = 0; k < 3; k++) a[k] = _mm512_loadu_si512(blk + 64 * (k + 1));
    } else {
        head = _mm512_i32gather_epi32(offsets, blk, 1);
        for (int k = 0; k < 3; k++) a[k] = _mm512_i32gather_epi32(offsets, blk + 4 * (k + 1), 1);
    }
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
    *dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)));
    k4_scales16_of(a[0], a[1], a[2], sc, mnp);
}

/* The 8 code words of chunk c (0..3: sub-blocks 2c, 2c + 1) of a Q4_K super-block of 16 rows: words[k] holds
   code bytes 32c + 4k..32c + 4k + 3 of each row (low nibbles: elements 4k.. of sub-block 2c, high: of 2c + 1). */
INLINE void k4_words16(const int r16, const uint8_t *blk, ptrdiff_t stride, int c, __m512i words[8]) {
    if (r16) {
        for (int k = 0; k < 8; k++) words[k] = _mm512_loadu_si512(blk + 64 * (4 + 8 * c + k));
    } else {
        rows16_words(blk + 16 + 32 * c, stride, words);
        rows16_words(blk + 32 + 32 * c, stride, words + 4);
    }
}

/* A token's float step for super-block b of 16 Q4_K rows, from their exact integer sums isum: f[0] += the sums'
   products, f[1] += the mins' (times the token's block sums), each one rounding (dot512_q4_k's k1_accumulate). */
INLINE void q4_k_step(__m512i isum, const __m512i *mnp, __m512 dw, __m512 dm, int b, const hk_act *at, __m512 *f) {
    __m512i msum = _mm512_setzero_si512();
    HK_UNROLL for (int j = 0; j < 8; j++) msum = _mm512_dpwssd_epi32(msum, _mm512_load_si512(mnp + j), bsum_pair(at, b, 2 * j));
    const __m512 da = _mm512_set1_ps(at->d[b]);
    f[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, da), b ? f[0] : _mm512_setzero_ps());
    f[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dm, da), b ? f[1] : _mm512_setzero_ps());
}

/* Tokens t0 .. t0 + nt - 1 (nt <= 8) against a decoded Q4_K super-block b of 16 rows: q[8j + l] holds the
   codes of sub-block j, elements 4l..4l+3. Each row's whole super-block as exact integers (vpdpbusd over a
   sub-block's 32 elements, at most 32 * 15 * 127, times its scale; the mins times the block sums), then
   dot512_q4_k's float step (k1_accumulate) for its lane in f[t]. */
INLINE void q4_k_tokens(const __m512i *q, const __m512i *sc, const __m512i *mnp, __m512 dw, __m512 dm, int b,
                        const hk_act *a, __m512 *f, int t0, const int nt) {
    a += t0;
    f += 2 * t0;
    __m512i isum[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_setzero_si512();
    for (int j = 0; j < 8; j++) {
        __m512i s[HK_MAX_NT];
        HK_UNROLL for (int t = 0; t < nt; t++) s[t] = _mm512_setzero_si512();
        HK_UNROLL for (int l = 0; l < 8; l++) {
            const __m512i qv = _mm512_load_si512(q + 8 * j + l);
            HK_UNROLL for (int t = 0; t < nt; t++) s[t] = dpbusd_bcast(s[t], qv, a[t].qs + 256 * b + 32 * j + 4 * l);
        }
        const __m512i scj = _mm512_load_si512(sc + j);
        HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s[t], scj));
    }
    HK_UNROLL for (int t = 0; t < nt; t++) q4_k_step(isum[t], mnp, dw, dm, b, &a[t], f + 2 * t);
}

/* nt <= K1_TOKENS tokens through all nb super-blocks of 16 Q4_K rows, in the file layout or (r16) the 16-row
   one; f: (nt, 2) vectors of 16 rows. */
INLINE void q4_k_pass_of(const int r16, int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, __m512 *f) {
    const __m512i offsets = row_offsets(stride), m4 = _mm512_set1_epi8(0x0F);
    __m512i q[64] __attribute__((aligned(64))), sc[8] __attribute__((aligned(64))), mnp[8] __attribute__((aligned(64)));
    size_t line = 0;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * (r16 ? 16 * 144 : 144);
        prefetch_next_rows(w, stride, b, nb, &line);
        __m512 dw, dm;
        k4_head16(r16, blk, offsets, &dw, &dm, sc, mnp);
        for (int c = 0; c < 4; c++) {
            __m512i words[8];
            k4_words16(r16, blk, stride, c, words);
            for (int k = 0; k < 8; k++) { /* low nibbles: sub-block 2c; high nibbles: 2c + 1 */
                q[16 * c + k] = _mm512_and_si512(words[k], m4);
                q[16 * c + 8 + k] = _mm512_and_si512(_mm512_srli_epi32(words[k], 4), m4);
            }
        }
        TOKEN_GROUPS(n, q4_k_tokens, q, sc, mnp, dw, dm, b, a, f)
    }
}

INLINE void q4_k_pass(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, __m512 *f) {
    q4_k_pass_of(0, nb, w, stride, a, n, f);
}

INLINE void q4_k_r16_pass(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, __m512 *f) {
    q4_k_pass_of(1, nb, w, stride, a, n, f);
}

/* A tile of nt <= HK_TILE tokens against 16 rows of Q4_K's 16-row layout, straight from the loads (no decoded
   copy of the super-block). High nibbles are summed in place, masked with 0xF0: 16 times their codes' sums
   (at most 32 * 240 * 127 a sub-block, times its scale at most 63, four a super-block: under 2^28), divided
   by 16 at the end, exactly. So the integers are q4_k_tokens', and the float steps too: the same bits. The
   layout is one stream, prefetched ahead only where the hardware prefetcher does not follow it alone
   (stream_ahead); with the next 16 rows prefetched, Llama-3.2-1B Q4_K_M's Q4_K products read 0.81x and its
   decode 0.87x on Zen (paired, one process). */
INLINE void q4_k_r16_nt(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m4h = _mm512_set1_epi8((char)0xF0);
    __m512 f[2 * HK_TILE] = {0}; /* per token the sums' and the mins' products; nb = 0: zeros */
    __m512i sc[8] __attribute__((aligned(64))), mnp[8] __attribute__((aligned(64)));
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 16 * 144;
        stream_ahead(w, b, 16 * 144);
        prefetch_act(a, nt, (size_t)HK_QK_K * b, HK_QK_K);
        __m512 dw, dm;
        k4_head16(1, blk, _mm512_setzero_si512(), &dw, &dm, sc, mnp);
        __m512i lo[HK_TILE], hi[HK_TILE];
        HK_UNROLL for (int t = 0; t < nt; t++) lo[t] = hi[t] = _mm512_setzero_si512();
        /* chains per sum: with one or two tokens vpdpbusd's latency, not its throughput, bounds a chain of 8 */
        const int S = nt <= 2 ? 2 : 1;
        HK_UNROLL for (int c = 0; c < 4; c++) {
            __m512i sl[2 * HK_TILE], sh[2 * HK_TILE];
            HK_UNROLL for (int t = 0; t < S * nt; t++) sl[t] = sh[t] = _mm512_setzero_si512();
            HK_UNROLL for (int k = 0; k < 8; k++) {
                const __m512i v = _mm512_loadu_si512(blk + 64 * (4 + 8 * c + k));
                const __m512i ql = _mm512_and_si512(v, m4), qh = _mm512_and_si512(v, m4h);
                HK_UNROLL for (int t = 0; t < nt; t++) {
                    const int8_t *aq = a[t].qs + 256 * b + 64 * c + 4 * k;
                    sl[S * t + k % S] = dpbusd_bcast(sl[S * t + k % S], ql, aq);
                    sh[S * t + k % S] = dpbusd_bcast(sh[S * t + k % S], qh, aq + 32);
                }
            }
            HK_UNROLL for (int t = 0; t < nt; t++) {
                __m512i l = sl[S * t], h = sh[S * t];
                if (S == 2) l = _mm512_add_epi32(l, sl[S * t + 1]), h = _mm512_add_epi32(h, sh[S * t + 1]);
                lo[t] = _mm512_add_epi32(lo[t], _mm512_mullo_epi32(l, sc[2 * c]));
                hi[t] = _mm512_add_epi32(hi[t], _mm512_mullo_epi32(h, sc[2 * c + 1]));
            }
        }
        HK_UNROLL for (int t = 0; t < nt; t++)
            q4_k_step(_mm512_add_epi32(lo[t], _mm512_srai_epi32(hi[t], 4)), mnp, dw, dm, b, &a[t], f + 2 * t);
    }
    HK_UNROLL for (int t = 0; t < nt; t++) _mm512_storeu_ps(out + t * os, _mm512_sub_ps(f[2 * t], f[2 * t + 1]));
}

ROWS16_NT(rows16_q4_k_r16, q4_k_r16_nt)

/* A token's float step for super-block b of 16 Q6_K rows, from their exact integer sums isum (the codes 0..63
   times the activations, times the sub-block scales): less 32 times the scales times the block sums (the codes'
   -32 offset), then dot512_q6_k's one rounding step into f. */
INLINE __m512 q6_k_step(__m512i isum, const __m512i *sc_pairs, __m512 dw, int b, const hk_act *at, __m512 f) {
    __m512i off = _mm512_setzero_si512(); /* 32 * sum(scale * bsum) */
    HK_UNROLL for (int m = 0; m < 8; m++) off = _mm512_dpwssd_epi32(off, _mm512_load_si512(sc_pairs + m), bsum_pair(at, b, 2 * m));
    const __m512i total = _mm512_sub_epi32(isum, _mm512_slli_epi32(off, 5));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(dw, _mm512_set1_ps(at->d[b])), b ? f : _mm512_setzero_ps());
}

/* Tokens t0 .. t0 + nt - 1 (nt <= 8) against a decoded Q6_K super-block b of 16 rows: q[4s + k] holds the
   codes (0..63) of the 16-element sub-block s, elements 4k..4k+3, sc[s] its scale as int32 lanes,
   sc_pairs[p] scales 2p and 2p + 1 as an int16 pair. Each row's super-block as exact integers (vpdpbusd
   over a sub-block, times its scale), then q6_k_step for its lane in f[t]. */
INLINE void q6_k_tokens(const __m512i *q, const __m512i *sc, const __m512i *sc_pairs, __m512 dw, int b,
                        const hk_act *a, __m512 *f, int t0, const int nt) {
    a += t0;
    f += t0;
    __m512i isum[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_setzero_si512();
    for (int s = 0; s < 16; s++) {
        __m512i p[HK_MAX_NT];
        HK_UNROLL for (int t = 0; t < nt; t++) p[t] = _mm512_setzero_si512();
        HK_UNROLL for (int k = 0; k < 4; k++) {
            const __m512i qv = _mm512_load_si512(q + 4 * s + k);
            HK_UNROLL for (int t = 0; t < nt; t++) p[t] = dpbusd_bcast(p[t], qv, a[t].qs + 256 * b + 16 * s + 4 * k);
        }
        const __m512i scs = _mm512_load_si512(sc + s);
        HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(p[t], scs));
    }
    HK_UNROLL for (int t = 0; t < nt; t++) f[t] = q6_k_step(isum[t], sc_pairs, dw, b, &a[t], f[t]);
}

/* A super-block's d (as floats) and 16 scales of 16 Q6_K rows: sc[s] scale s as int32 lanes, sc_pairs[p]
   scales 2p and 2p + 1 as an int16 pair. blk: the block in the file layout, or (r16) its vectors, with the rows'
   d at head (hk_r16_head, hk_r16_body). */
INLINE void q6_k_head16(const int r16, const uint8_t *blk, const uint8_t *head, ptrdiff_t stride, __m512i offsets,
                        __m512 *dw, __m512i sc[16], __m512i sc_pairs[8]) {
    if (r16)
        *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)head));
    else /* d is bytes 208-209: gathered from 206 so no lane reads past the block */
        *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_i32gather_epi32(offsets, blk + 206, 1), 16)));
    __m512i scw[4]; /* lane r of scw[k]: row r's scales 4k..4k+3 */
    if (r16)
        for (int k = 0; k < 4; k++) scw[k] = _mm512_loadu_si512(blk + 64 * k);
    else
        rows16_words(blk + 192, stride, scw);
    for (int s = 0; s < 16; s++) sc[s] = _mm512_srai_epi32(_mm512_slli_epi32(scw[s / 4], 24 - 8 * (s % 4)), 24);
    for (int p = 0; p < 8; p++)
        sc_pairs[p] = _mm512_or_si512(_mm512_and_si512(sc[2 * p], _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(sc[2 * p + 1], 16));
}

/* The codes (0..63) of 16 Q6_K rows' four sub-blocks 8h + 2i + e (i = 0..3) of a super-block: q[4i + k] their
   elements 4k..4k+3. Element l (of 16) of quarter i of half h has its low four bits in ql[64h + 16e + l]
   (i = 0, 2; high nibble for i = 2) or ql[64h + 32 + 16e + l] (i = 1, 3), its top two in qh[32h + 16e + l].
   blk: the block in the file layout, or (r16) its vectors. */
INLINE void q6_k_codes16(const int r16, const uint8_t *blk, ptrdiff_t stride, int h, int e, __m512i q[16]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i ql0[4], ql1[4], qh[4];
    if (r16) { /* the quarter's 12 vectors, in this order (see hk.h) */
        const uint8_t *v = blk + 64 * (4 + 12 * (2 * h + e));
        for (int k = 0; k < 4; k++) {
            ql0[k] = _mm512_loadu_si512(v + 64 * k);
            ql1[k] = _mm512_loadu_si512(v + 64 * (4 + k));
            qh[k] = _mm512_loadu_si512(v + 64 * (8 + k));
        }
    } else {
        rows16_words(blk + 64 * h + 16 * e, stride, ql0);
        rows16_words(blk + 64 * h + 32 + 16 * e, stride, ql1);
        rows16_words(blk + 128 + 32 * h + 16 * e, stride, qh);
    }
    /* qa: qh's bit pairs 0 and 2 of each byte (quarters 0 and 2) at bits 0-1 and 4-5, qb: pairs 1 and 3; each
       code is then one bitwise select (vpternlogd 0xCA: m4 ? low nibble : high bits), the bits a shift moved
       across bytes landing only where the other operand is chosen */
    const __m512i m33 = _mm512_set1_epi8(0x33);
    HK_UNROLL for (int k = 0; k < 4; k++) {
        const __m512i qa = _mm512_and_si512(qh[k], m33), qb = _mm512_and_si512(_mm512_srli_epi32(qh[k], 2), m33);
        q[k] = _mm512_ternarylogic_epi32(m4, ql0[k], _mm512_slli_epi32(qa, 4), 0xCA);
        q[4 + k] = _mm512_ternarylogic_epi32(m4, ql1[k], _mm512_slli_epi32(qb, 4), 0xCA);
        q[8 + k] = _mm512_ternarylogic_epi32(m4, _mm512_srli_epi32(ql0[k], 4), qa, 0xCA);
        q[12 + k] = _mm512_ternarylogic_epi32(m4, _mm512_srli_epi32(ql1[k], 4), qb, 0xCA);
    }
}

/* nt <= K1_TOKENS tokens through all nb super-blocks of 16 Q6_K rows, in the file layout or (r16) the 16-row
   one; f: (nt,) vectors of 16 rows. */
INLINE void q6_k_pass_of(const int r16, int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, __m512 *f) {
    const __m512i offsets = row_offsets(stride);
    __m512i q[64] __attribute__((aligned(64))), sc[16] __attribute__((aligned(64))), sc_pairs[8] __attribute__((aligned(64)));
    size_t line = 0;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (r16 ? hk_r16_body(16 * 210, b, nb) : (size_t)b * 210);
        prefetch_next_rows(w, stride, b, nb, &line);
        __m512 dw;
        q6_k_head16(r16, blk, w + hk_r16_head(16 * 210, b), stride, offsets, &dw, sc, sc_pairs);
        HK_UNROLL for (int h = 0; h < 2; h++)
            HK_UNROLL for (int e = 0; e < 2; e++) {
                __m512i c[16];
                q6_k_codes16(r16, blk, stride, h, e, c);
                for (int i = 0; i < 4; i++) /* sub-block 8h + 2i + e */
                    for (int k = 0; k < 4; k++) q[4 * (8 * h + 2 * i + e) + k] = c[4 * i + k];
            }
        TOKEN_GROUPS(n, q6_k_tokens, q, sc, sc_pairs, dw, b, a, f)
    }
}

INLINE void q6_k_pass(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, __m512 *f) {
    q6_k_pass_of(0, nb, w, stride, a, n, f);
}

INLINE void q6_k_r16_pass(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, __m512 *f) {
    q6_k_pass_of(1, nb, w, stride, a, n, f);
}

/* A tile of nt <= HK_TILE tokens against 16 rows of Q6_K's 16-row layout, straight from the loads (no decoded
   copy of the super-block), one stream prefetched as in q4_k_r16_nt. The same integers per sub-block as
   q6_k_tokens, summed in another order (exact), and the same float step: the same bits. */
INLINE void q6_k_r16_nt(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, const int nt, float *out, ptrdiff_t os) {
    __m512 f[HK_TILE] = {0}; /* nb = 0: zeros */
    __m512i sc[16] __attribute__((aligned(64))), sc_pairs[8] __attribute__((aligned(64)));
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + hk_r16_body(16 * 210, b, nb);
        stream_ahead(w, b, 16 * 210);
        prefetch_act(a, nt, (size_t)HK_QK_K * b, HK_QK_K);
        __m512 dw;
        q6_k_head16(1, blk, w + hk_r16_head(16 * 210, b), stride, _mm512_setzero_si512(), &dw, sc, sc_pairs);
        __m512i isum[HK_TILE];
        HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_setzero_si512();
        HK_UNROLL for (int h = 0; h < 2; h++)
            HK_UNROLL for (int e = 0; e < 2; e++) {
                __m512i q[16];
                q6_k_codes16(1, blk, stride, h, e, q);
                HK_UNROLL for (int i = 0; i < 4; i++) {
                    const int s = 8 * h + 2 * i + e;
                    __m512i p[HK_TILE];
                    HK_UNROLL for (int t = 0; t < nt; t++) p[t] = _mm512_setzero_si512();
                    HK_UNROLL for (int k = 0; k < 4; k++)
                        HK_UNROLL for (int t = 0; t < nt; t++) p[t] = dpbusd_bcast(p[t], q[4 * i + k], a[t].qs + 256 * b + 16 * s + 4 * k);
                    HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(p[t], sc[s]));
                }
            }
        HK_UNROLL for (int t = 0; t < nt; t++) f[t] = q6_k_step(isum[t], sc_pairs, dw, b, &a[t], f[t]);
    }
    HK_UNROLL for (int t = 0; t < nt; t++) _mm512_storeu_ps(out + t * os, f[t]);
}

ROWS16_NT(rows16_q6_k_r16, q6_k_r16_nt)

/* A K-quant GEMM: K1_TOKENS tokens a pass; pass leaves (nt, lanes) vectors in f, lanes added by sum. */
#define GEMM16_K(name, pass, lanes, sum)                                                                     \
    void hk_##name(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, float *out, ptrdiff_t os) { \
        __m512 f[(lanes) * K1_TOKENS] __attribute__((aligned(64)));                                          \
        for (int t0 = 0; t0 < n; t0 += K1_TOKENS) {                                                          \
            const int nk = n - t0 < K1_TOKENS ? n - t0 : K1_TOKENS;                                          \
            pass(nb, w, stride, a + t0, nk, f);                                                              \
            for (int t = 0; t < nk; t++) _mm512_storeu_ps(out + (ptrdiff_t)(t0 + t) * os, sum(f + (lanes) * t)); \
        }                                                                                                    \
    }

INLINE __m512 sums_less_mins(const __m512 *f) { return _mm512_sub_ps(f[0], f[1]); }
INLINE __m512 one_lane(const __m512 *f) { return f[0]; }

GEMM16_K(gemm16_q4_k, q4_k_pass, 2, sums_less_mins)
GEMM16_K(gemm16_q6_k, q6_k_pass, 1, one_lane)
GEMM16_K(gemm16_q4_k_r16, q4_k_r16_pass, 2, sums_less_mins)
GEMM16_K(gemm16_q6_k_r16, q6_k_r16_pass, 1, one_lane)

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
