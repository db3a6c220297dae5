/* AVX-512 (F, BW, VL, VNNI) kernels for 16 rows of the legacy 32-blocks at once, one row per 32-bit lane: dot16
   (a tile of up to 8 tokens) and gemm16 (any number of tokens, each block of the rows decoded once); Q4_K /
   Q6_K are in kernels_avx512_k16.c. The rows' bytes are transposed in registers, or loaded as they lie from
   a 16-row layout (hk.h); Q8_0's one-token kernel sums its products across lanes instead.
   Every result is the same bits as the kernel hk_dot_rows would otherwise run for that row (see hk.h), so
   which one runs, and how many tokens a product has, is a matter of speed only. */
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

/* Bytes per block of a legacy 32-element type (as kernels_x86.inc). */
INLINE int size32(int type) {
    if (hk_is_r16(type)) return 16 * (type == HK_Q8_0_R16 ? 34 : 18); /* a block of all 16 rows: see hk.h */
    return type == HK_Q4_0 || type == HK_IQ4_NL ? 18 : type == HK_Q4_1 ? 20 : type == HK_Q5_0 ? 22 : type == HK_Q5_1 ? 24
         : type == HK_MXFP4 ? 17 : 34;
}

/* -- 16 rows at once for Q4_0, Q4_1 and Q8_0: one lane per row, so a token's activation word is broadcast to
   every row and each of its scale products serves 16 rows. The rows' bytes are transposed in registers (no
   repacked copy of the weights); the per-row arithmetic is the same for every tile width, so a batched
   decode gives each sequence the logits it would get alone. */

/* hk_e8m0_half of the low byte of each lane. */
INLINE __m512 e8m0_half16(__m512i v) {
    __m512i e = _mm512_and_si512(v, _mm512_set1_epi32(0xFF));
    __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2)), normal, subnormal));
}

/* q[k] and q[k + 4]: the low and high nibbles of words[k] (elements 4k..4k+3 and 16 + 4k..16 + 4k + 3 of a
   block), through the type's table for IQ4_NL and MXFP4 (their values plus 128 or 12: unsigned codes). */
INLINE void nibbles16(const int type, const __m512i *words, __m512i *q) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; k++) {
        q[k] = _mm512_and_si512(words[k], m4);
        q[k + 4] = _mm512_and_si512(_mm512_srli_epi32(words[k], 4), m4);
    }
    if (type == HK_IQ4_NL || type == HK_MXFP4) {
        const __m512i table = type == HK_IQ4_NL ? _mm512_broadcast_i32x4(_mm_xor_si128(loadu128(hk_kvalues_iq4nl), _mm_set1_epi8((char)0x80)))
                                                : _mm512_broadcast_i32x4(_mm_add_epi8(loadu128(hk_kvalues_mxfp4), _mm_set1_epi8(12)));
        for (int k = 0; k < 8; k++) q[k] = _mm512_shuffle_epi8(table, q[k]);
    }
}

/* Decode block b (of nb) of 16 rows at w: q[k] the codes of elements 4k..4k+3 (0-15 low, 16-31 high for the
   nibble types) in each row's lane, dw the rows' scales and cw their offsets (see rows16_nt). */
INLINE void block16_decode(const int type, const uint8_t *w, int b, int nb, ptrdiff_t stride, __m512i offsets, __m512i *q,
                           __m512 *dw, __m512 *cw) {
    __m512i words[4], lead[4];
    if (hk_is_r16(type)) { /* already in lanes: the scales, then the code vectors (see hk.h) */
        const uint8_t *body = w + hk_r16_body(size32(type), b, nb);
        *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + hk_r16_head(size32(type), b))));
        *cw = _mm512_mul_ps(*dw, _mm512_set1_ps(type == HK_Q4_0_R16 ? -8.0f : -128.0f));
        if (type == HK_Q8_0_R16) { /* signed bytes to unsigned codes w + 128 */
            const __m512i flip = _mm512_set1_epi8((char)0x80);
            for (int k = 0; k < 8; k++) q[k] = _mm512_xor_si512(_mm512_loadu_si512(body + 64 * k), flip);
            return;
        }
        for (int k = 0; k < 4; k++) words[k] = _mm512_loadu_si512(body + 64 * k);
        nibbles16(hk_r16_base(type), words, q);
        return;
    }
    const uint8_t *blk = w + (size_t)b * size32(type);
    const int five = type == HK_Q5_0 || type == HK_Q5_1;
    /* the Q5 types' scales and fifth bits transposed, not gathered (measured faster): Q5_0's are d | qh << 16
       and qh >> 16 in lead[0] and lead[1], Q5_1's d | m << 16 and qh */
    if (five) rows16_words(blk, stride, lead);
    __m512i head = five ? lead[0] : _mm512_i32gather_epi32(offsets, blk, 1); /* head: each row's d (and m) */
    *dw = type == HK_MXFP4 ? e8m0_half16(head) : _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
    const float off = type == HK_Q8_0 || type == HK_IQ4_NL ? -128.0f : type == HK_MXFP4 ? -12.0f : type == HK_Q5_0 ? -16.0f : -8.0f;
    *cw = type == HK_Q4_1 || type == HK_Q5_1 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)))
                                             : _mm512_mul_ps(*dw, _mm512_set1_ps(off));
    if (type == HK_Q8_0) { /* signed bytes to unsigned codes w + 128, elements 0-15 then 16-31 */
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        rows16_words(blk + 2, stride, words);
        for (int k = 0; k < 4; k++) q[k] = _mm512_xor_si512(words[k], flip);
        rows16_words(blk + 18, stride, words);
        for (int k = 0; k < 4; k++) q[k + 4] = _mm512_xor_si512(words[k], flip);
    } else {
        const int qs_at = type == HK_Q4_1 ? 4 : type == HK_MXFP4 ? 1 : type == HK_Q5_0 ? 6 : type == HK_Q5_1 ? 8 : 2;
        rows16_words(blk + qs_at, stride, words);
        nibbles16(type, words, q);
        if (five) { /* bit j of each row's 32 fifth bits (qh) is bit 4 of element j's code */
            const __m512i qh = type == HK_Q5_0 ? _mm512_or_si512(_mm512_srli_epi32(lead[0], 16), _mm512_slli_epi32(lead[1], 16)) : lead[1];
            const __m512i spread = _mm512_setr_epi32(0x00000000, 0x00000010, 0x00001000, 0x00001010, 0x00100000, 0x00100010,
                                                     0x00101000, 0x00101010, 0x10000000, 0x10000010, 0x10001000, 0x10001010,
                                                     0x10100000, 0x10100010, 0x10101000, 0x10101010); /* 4 bits to 4 bytes' bit 4 */
            for (int k = 0; k < 8; k++) q[k] = _mm512_or_si512(q[k], _mm512_permutexvar_epi32(_mm512_srli_epi32(qh, 4 * k), spread));
        }
    }
}

/* -- Q4_0 and IQ4_NL eight blocks at a time, without a gather: two 18-byte blocks are nine 32-bit words, so
   eight are 144 bytes of a row, nine 4-word transposes of 16 rows that bring the scales along with the codes.
   The gather of 16 rows' scales a block took about 40 % of rows16_nt's time (one thread, matrix in cache:
   Q4_0 29-30 GB/s with it, 48-49 without; this kernel 48-51). Decoded blocks are the same vectors, so the
   results are the same bits. */

#define OCT_BLOCKS 8 /* 144 bytes of each row: nine transposes */

INLINE int oct16_type(int type) { return type == HK_Q4_0 || type == HK_IQ4_NL; }

/* Block j (0-7) of eight whose words are t[0..35] (lane r: row r), as block16_decode leaves it. Block 2m
   is bytes 2-17 of words 9m..9m + 4 with its scale in the low half of word 9m; block 2m + 1 is words
   9m + 5..9m + 8 with its scale in the high half of word 9m + 4. */
INLINE void oct16_block(const int type, const __m512i *t, int j, __m512i *q, __m512 *dw, __m512 *cw) {
    const __m512i *u = t + 9 * (j / 2);
    __m512i d, c[4];
    if (j % 2 == 0) {
        d = u[0];
        for (int k = 0; k < 4; k++) c[k] = _mm512_or_si512(_mm512_srli_epi32(u[k], 16), _mm512_slli_epi32(u[k + 1], 16));
    } else {
        d = _mm512_srli_epi32(u[4], 16);
        for (int k = 0; k < 4; k++) c[k] = u[5 + k];
    }
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)); /* vpmovdw keeps each lane's low 16 bits */
    *cw = _mm512_mul_ps(*dw, _mm512_set1_ps(type == HK_IQ4_NL ? -128.0f : -8.0f));
    nibbles16(type, c, q);
}

/* The sum of a block's 32 activation bytes (as unsigned bytes 128 more, summed by vpsadbw). */
INLINE int block_sum32(const int8_t *aq) {
    __m256i s = _mm256_sad_epu8(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)aq), _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
    __m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return (int)(_mm_cvtsi128_si64(t) + _mm_extract_epi64(t, 1)) - 32 * 128;
}

/* A decoded block b's exact integer sums against a token's activations aq (lane r: row r). Q5_0's -16 is taken
   off the exact integer sum, as llama.cpp's kernels do: through the float block sums (cw * ds) two large terms
   would cancel, and the real models' logits measured further from llama.cpp's. */
INLINE __m512i block16_isum(const int type, const __m512i *q, const int8_t *aq) {
    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
        even = dpbusd_bcast(even, _mm512_load_si512(q + k), aq + 4 * k);
        odd = dpbusd_bcast(odd, _mm512_load_si512(q + k + 1), aq + 4 * k + 4);
    }
    __m512i isum = _mm512_add_epi32(even, odd);
    return type == HK_Q5_0 ? _mm512_sub_epi32(isum, _mm512_set1_epi32(16 * block_sum32(aq))) : isum;
}

/* acc plus block b's products from its exact integer sums isum: the float steps every kernel here takes. */
INLINE __m512 block16_accumulate(const int type, __m512i isum, __m512 dw, __m512 cw, int b, const hk_act *at, __m512 acc) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(at->d[b])), acc);
    return type == HK_Q5_0 ? acc : _mm512_fmadd_ps(cw, _mm512_set1_ps(at->ds[b]), acc);
}

/* One decoded block b against a token's activations: acc + its products (the same steps in every kernel). */
INLINE __m512 block16_token(const int type, const __m512i *q, __m512 dw, __m512 cw, int b, const hk_act *at, __m512 acc) {
    return block16_accumulate(type, block16_isum(type, q, at->qs + b * HK_QK), dw, cw, b, at, acc);
}

/* out[t * os + r] = row r . a[t] for 16 rows stride bytes apart. Codes are unsigned bytes in q[k] (lane r:
   elements 4k..4k+3 of row r's block); the offset (Q4_0's -8, Q4_1's min, Q8_0's -128 after its signed
   bytes are flipped to w + 128, and the table types' -128 or -12 after their look-up plus that much) goes
   through the activations' block sums, as in dot32x2_nt. The file layout's 16 rows are 16 interleaved streams,
   whose next 16 rows are prefetched (prefetch_next_rows); a 16-row layout reads one stream, which the hardware
   prefetcher follows better (on Zen, without the next rows prefetched, a one-token product of Llama-3.2-1B Q8_0's
   repacked matrices read 1.36x the file layout's and its decode ran 1.26x, Q4_0's 1.18x: docs/benchmarks.md),
   prefetched ahead only where it does not follow alone (stream_ahead). */
INLINE void rows16_nt(const int type, int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, const int nt,
                      float *out, ptrdiff_t os) {
    const int ts = size32(type);
    const __m512i offsets = row_offsets(stride);
    __m512 acc[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    size_t line = 0;
    int b = 0;
    if (oct16_type(type))
        for (; b + OCT_BLOCKS <= nb; b += OCT_BLOCKS) {
            const uint8_t *blk = w + (size_t)b * ts;
            __m512i t[36];
            rows16_words(blk, stride, t);
            HK_UNROLL for (int j = 0; j < OCT_BLOCKS; j++) { /* block j needs words up to 4j + 7 */
                __m512i q[8] __attribute__((aligned(64)));
                __m512 dw, cw;
                prefetch_next_rows(w, stride, b + j, nb, &line);
                prefetch_act(a, nt, (size_t)HK_QK * (b + j), HK_QK);
                rows16_words(blk + 16 * (j + 1), stride, t + 4 * (j + 1));
                oct16_block(type, t, j, q, &dw, &cw);
                HK_UNROLL for (int k = 0; k < nt; k++) acc[k] = block16_token(type, q, dw, cw, b + j, &a[k], acc[k]);
            }
        }
    for (; b < nb; b++) {
        if (hk_is_r16(type)) stream_ahead(w, b, ts); /* ts: the 16 rows' bytes */
        else prefetch_next_rows(w, stride, b, nb, &line);
        prefetch_act(a, nt, (size_t)HK_QK * b, HK_QK);
        __m512i q[8] __attribute__((aligned(64)));
        __m512 dw, cw;
        block16_decode(type, w, b, nb, stride, offsets, q, &dw, &cw);
        HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = block16_token(type, q, dw, cw, b, &a[t], acc[t]);
    }
    HK_UNROLL for (int t = 0; t < nt; t++) _mm512_storeu_ps(out + t * os, acc[t]);
}

#define ROWS16(name, type)                                                                                   \
    void hk_##name(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os) { \
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
ROWS16(rows16_q5_0, HK_Q5_0)
ROWS16(rows16_q5_1, HK_Q5_1)
ROWS16(rows16_q8_0_tile, HK_Q8_0)
ROWS16(rows16_iq4_nl, HK_IQ4_NL)
ROWS16(rows16_mxfp4, HK_MXFP4)
ROWS16(rows16_q4_0_r16, HK_Q4_0_R16)
ROWS16(rows16_iq4_nl_r16, HK_IQ4_NL_R16)
ROWS16(rows16_q8_0_r16, HK_Q8_0_R16)

/* -- Q8_0 against one token (decode): a row's 32 bytes of a block are already whole codes, so instead of
   transposing them into lanes (rows16_nt: two 4 x 4 word transposes a block) each row's block takes one
   256-bit half of a vector in file order and the products' eight lanes per row are summed by a shuffle tree,
   about half the shuffles. Two blocks a step: one 64-byte load of the activations, 68 contiguous bytes of
   each row. The integer sums are exact, so the float steps (block16_accumulate) see the same numbers and the
   results are rows16_nt's bits. */

INLINE __m256i loadu256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* The sums of eight int32 lanes per half: z[j] (j < 4) holds sums j (lanes 0-7) and j + 4 (lanes 8-15), z[4 + j]
   sums 8 + j and 12 + j; lane i of the result is sum i. */
INLINE __m512i sum8_lanes16(const __m512i *z) {
    __m512i u[2];
    for (int h = 0; h < 2; h++) { /* u[h]: per 128-bit lane k, part k of z[4h] .. z[4h + 3] */
        const __m512i *y = z + 4 * h;
        const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(y[0], y[1]), _mm512_unpackhi_epi32(y[0], y[1]));
        const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(y[2], y[3]), _mm512_unpackhi_epi32(y[2], y[3]));
        u[h] = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
    }
    return _mm512_add_epi32(_mm512_shuffle_i64x2(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i64x2(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* w + 128 for the 32 signed codes at p (low half) and at q (high half). */
INLINE __m512i q8_0_codes2(const uint8_t *p, const uint8_t *q) {
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(loadu256(p)), loadu256(q), 1);
    return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
}

/* Blocks blk and blk + 34 of 16 rows against their 64 activation bytes aq: each row's exact integer sums
   (lane r: row r) of the first block in *s0, of the second in *s1. */
INLINE void q8_0_pair16_isum(const uint8_t *blk, ptrdiff_t stride, const int8_t *aq, __m512i *s0, __m512i *s1) {
    const __m512i av = _mm512_loadu_si512(aq);
    __m512i p[16]; /* row r: block 0 in lanes 0-7, block 1 in 8-15 */
    for (int r = 0; r < 16; r++)
        p[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q8_0_codes2(blk + r * stride + 2, blk + r * stride + 36), av);
    /* x: rows 0-3 block 0, rows 0-3 block 1, rows 4-7 block 0, rows 4-7 block 1; y: the same for rows 8-15 */
    const __m512i x = sum8_lanes16(p), y = sum8_lanes16(p + 8);
    *s0 = _mm512_shuffle_i64x2(x, y, _MM_SHUFFLE(2, 0, 2, 0));
    *s1 = _mm512_shuffle_i64x2(x, y, _MM_SHUFFLE(3, 1, 3, 1));
}

/* One block of 16 rows: rows j and j + 4 in the halves of a vector, the activations' 32 bytes in both. */
INLINE __m512i q8_0_one16_isum(const uint8_t *blk, ptrdiff_t stride, const int8_t *aq) {
    const __m512i av = _mm512_broadcast_i64x4(loadu256(aq));
    __m512i z[8];
    for (int j = 0; j < 8; j++) {
        const uint8_t *row = blk + ((j & 3) + 8 * (j >> 2)) * stride + 2;
        z[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q8_0_codes2(row, row + 4 * stride), av);
    }
    return sum8_lanes16(z);
}

/* The rows' float16 scales of the block at blk as floats, and the -128 offset's factor. */
INLINE __m512 q8_0_scales16(const uint8_t *blk, __m512i offsets, __m512 *cw) {
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(offsets, blk, 1)));
    *cw = _mm512_mul_ps(dw, _mm512_set1_ps(-128.0f));
    return dw;
}

static void q8_0_rows16_one(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, float *out) {
    const __m512i offsets = row_offsets(stride);
    __m512 acc = _mm512_setzero_ps(), dw, cw;
    __m512i s0, s1;
    size_t line = 0;
    int b = 0;
    for (; b + 1 < nb; b += 2) {
        const uint8_t *blk = w + (size_t)b * 34;
        prefetch_next_rows(w, stride, b + 1, nb, &line); /* the lines of both blocks' share */
        q8_0_pair16_isum(blk, stride, a->qs + b * HK_QK, &s0, &s1);
        dw = q8_0_scales16(blk, offsets, &cw);
        acc = block16_accumulate(HK_Q8_0, s0, dw, cw, b, a, acc);
        dw = q8_0_scales16(blk + 34, offsets, &cw);
        acc = block16_accumulate(HK_Q8_0, s1, dw, cw, b + 1, a, acc);
    }
    if (b < nb) {
        const uint8_t *blk = w + (size_t)b * 34;
        prefetch_next_rows(w, stride, b, nb, &line);
        dw = q8_0_scales16(blk, offsets, &cw);
        acc = block16_accumulate(HK_Q8_0, q8_0_one16_isum(blk, stride, a->qs + b * HK_QK), dw, cw, b, a, acc);
    }
    _mm512_storeu_ps(out, acc);
}

void hk_rows16_q8_0(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os) {
    if (nt == 1)
        q8_0_rows16_one(nb, w, stride, a, out);
    else
        hk_rows16_q8_0_tile(nb, w, stride, a, nt, out, os);
}

#define GROUP_BLOCKS 8 /* legacy blocks decoded at a time by gemm16_32: 8 x 32 elements of 16 rows */

/* Tokens t0 .. t0 + nt - 1 against up to GROUP_BLOCKS decoded blocks from b0; acc (16 floats at out + t * os)
   starts at zero on the first block and is read back after, so each result is rows16_nt's. */
INLINE void blocks16_tokens(const int type, const __m512i *q, const __m512 *dw, const __m512 *cw, int b0, int nbb, const hk_act *a,
                            float *out, ptrdiff_t os, int t0, const int nt) {
    a += t0;
    out += (ptrdiff_t)t0 * os;
    __m512 acc[HK_MAX_NT];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = b0 ? _mm512_loadu_ps(out + t * os) : _mm512_setzero_ps();
    for (int j = 0; j < nbb; j++)
        HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = block16_token(type, q + 8 * j, dw[j], cw[j], b0 + j, &a[t], acc[t]);
    HK_UNROLL for (int t = 0; t < nt; t++) _mm512_storeu_ps(out + t * os, acc[t]);
}

INLINE void gemm16_32(const int type, int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, float *out, ptrdiff_t os) {
    const __m512i offsets = row_offsets(stride);
    __m512i q[8 * GROUP_BLOCKS] __attribute__((aligned(64)));
    __m512 dw[GROUP_BLOCKS], cw[GROUP_BLOCKS];
    size_t line = 0;
    for (int b0 = 0; b0 < nb; b0 += GROUP_BLOCKS) {
        const int nbb = nb - b0 < GROUP_BLOCKS ? nb - b0 : GROUP_BLOCKS;
        for (int j = 0; j < nbb; j++) {
            prefetch_next_rows(w, stride, b0 + j, nb, &line);
            block16_decode(type, w, b0 + j, nb, stride, offsets, q + 8 * j, &dw[j], &cw[j]);
        }
        TOKEN_GROUPS(n, blocks16_tokens, type, q, dw, cw, b0, nbb, a, out, os)
    }
}

#define GEMM16_32(name, type) HK_ROWS16_FOR_TYPE(hk_##name, gemm16_32, type)

GEMM16_32(gemm16_q4_0, HK_Q4_0)
GEMM16_32(gemm16_q4_1, HK_Q4_1)
GEMM16_32(gemm16_q5_0, HK_Q5_0)
GEMM16_32(gemm16_q5_1, HK_Q5_1)
GEMM16_32(gemm16_q8_0, HK_Q8_0)
GEMM16_32(gemm16_iq4_nl, HK_IQ4_NL)
GEMM16_32(gemm16_mxfp4, HK_MXFP4)
GEMM16_32(gemm16_q4_0_r16, HK_Q4_0_R16)
GEMM16_32(gemm16_iq4_nl_r16, HK_IQ4_NL_R16)
GEMM16_32(gemm16_q8_0_r16, HK_Q8_0_R16)

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
