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

#define GEMM_TILE 8 /* tokens per pass over the decoded rows: 8 accumulators, 8 group sums, 8 block sums */

/* One super-block of 16 rows, decoded. */
typedef struct {
    int8_t q[64][64];   /* (k4, row, 4): values 4k4 .. 4k4 + 3 of row r at bytes 4r .. 4r + 3 of q[k4] */
    int32_t sc[16][16]; /* (group, row) integer scale of each group of 32 (or 16) values */
    int32_t corr[16];   /* (row,) 128 * sum over groups of scale * sum(values) */
    float dw[16];       /* (row,) the block's float scale, as the row kernel computes it */
} iq_block16;

/* Groups of values under one integer scale: 16-value groups for IQ2_XS / IQ2_S, else 32. */
INLINE int groups_of(int type) { return type == HK_IQ2_XS || type == HK_IQ2_S ? 16 : 8; }

INLINE int block_bytes(int type) {
    switch (type) {
    case HK_IQ2_XXS: return 66;
    case HK_IQ2_XS: return 74;
    case HK_IQ2_S: return 82;
    case HK_IQ3_XXS: return 98;
    case HK_IQ3_S: return 110;
    default: return 136; /* IQ4_XS */
    }
}

/* The row kernel's float scale of a block (its d times the type's factor, in the same float steps). */
INLINE float block_dw(int type, const uint8_t *blk) {
    switch (type) {
    case HK_IQ2_XXS: case HK_IQ2_XS: case HK_IQ2_S: return 0.125f * f16x(blk);
    case HK_IQ3_XXS: return 0.25f * f16x(blk);
    case HK_IQ3_S: return 1.0f * f16x(blk);
    default: return f16x(blk);
    }
}

/* Scale of group g (32 values, or 16 for the 16-group types) of a block. */
INLINE int group_scale(int type, const uint8_t *blk, int g) {
    switch (type) {
    case HK_IQ2_XXS: return 2 * (int)(hk_u32(blk + 6 + 8 * g) >> 28) + 1;
    case HK_IQ3_XXS: return 2 * (int)(hk_u32(blk + 66 + 4 * g) >> 28) + 1;
    case HK_IQ3_S: return 2 * ((blk[106 + g / 2] >> (4 * (g & 1))) & 0xF) + 1;
    case HK_IQ2_XS: return 2 * ((blk[66 + g / 2] >> (4 * (g & 1))) & 0xF) + 1;
    case HK_IQ2_S: return 2 * ((blk[74 + g / 2] >> (4 * (g & 1))) & 0xF) + 1;
    default: return (((blk[4 + g / 2] >> (4 * (g & 1))) & 0xF) | (((hk_u16(blk + 2) >> (2 * g)) & 3) << 4)) - 32;
    }
}

/* The 32 signed values of sub-block ib, with the row kernels' decoders. */
INLINE __m256i sub_values(int type, const uint8_t *blk, int ib) {
    __m256i q, s, scale16;
    switch (type) {
    case HK_IQ2_XXS: iq2_xxs_sub(blk, ib, &q, &s, &scale16); break;
    case HK_IQ2_XS: iq2_xs_sub(blk, ib, &q, &s, &scale16); break;
    case HK_IQ2_S: iq2_s_sub(blk, ib, &q, &s, &scale16); break;
    case HK_IQ3_XXS: iq3_xxs_sub(blk, ib, &q, &s, &scale16); break;
    case HK_IQ3_S: iq3_s_sub(blk, ib, &q, &s, &scale16); break;
    default: return _mm256_shuffle_epi8(table16(hk_kvalues_iq4nl, 0), nibbles(blk + 8 + 16 * ib));
    }
    return _mm256_sign_epi8(q, s);
}

/* Rows' 16-byte segments (16 rows, 256 bytes apart) transposed into 4 vectors of 4-byte words: word k of
   row r in lane r of t[k]. */
INLINE void transpose_segment(const int8_t *p, __m512i t[4]) {
    __m512i z[4];
    for (int j = 0; j < 4; j++) { /* z[j]: rows j, j + 4, j + 8, j + 12 in its four 128-bit lanes */
        __m512i v = _mm512_castsi128_si512(loadu128(p + 256 * j));
        v = _mm512_inserti32x4(v, loadu128(p + 256 * (j + 4)), 1);
        v = _mm512_inserti32x4(v, loadu128(p + 256 * (j + 8)), 2);
        z[j] = _mm512_inserti32x4(v, loadu128(p + 256 * (j + 12)), 3);
    }
    __m512i a = _mm512_unpacklo_epi32(z[0], z[1]), b = _mm512_unpackhi_epi32(z[0], z[1]);
    __m512i c = _mm512_unpacklo_epi32(z[2], z[3]), d = _mm512_unpackhi_epi32(z[2], z[3]);
    t[0] = _mm512_unpacklo_epi64(a, c);
    t[1] = _mm512_unpackhi_epi64(a, c);
    t[2] = _mm512_unpacklo_epi64(b, d);
    t[3] = _mm512_unpackhi_epi64(b, d);
}

/* Block b of 16 rows (stride bytes apart) into out. */
static void decode_block16(int type, const uint8_t *w, ptrdiff_t stride, int b, iq_block16 *out) {
    const int ts = block_bytes(type), ng = groups_of(type), per_group = 64 / ng;
    int8_t rowvals[16][256] __attribute__((aligned(64)));
    for (int r = 0; r < 16; r++) {
        const uint8_t *blk = w + r * stride + (ptrdiff_t)b * ts;
        for (int ib = 0; ib < 8; ib++) _mm256_store_si256((__m256i *)(void *)&rowvals[r][32 * ib], sub_values(type, blk, ib));
        for (int g = 0; g < ng; g++) out->sc[g][r] = group_scale(type, blk, g);
        out->dw[r] = block_dw(type, blk);
    }
    for (int seg = 0; seg < 16; seg++) {
        __m512i t[4];
        transpose_segment(&rowvals[0][16 * seg], t);
        for (int k = 0; k < 4; k++) _mm512_store_si512(out->q[4 * seg + k], t[k]);
    }
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i corr = _mm512_setzero_si512();
    for (int g = 0; g < ng; g++) {
        __m512i sum = _mm512_setzero_si512();
        for (int j = 0; j < per_group; j++) sum = _mm512_dpbusd_epi32(sum, ones, _mm512_load_si512(out->q[g * per_group + j]));
        corr = _mm512_add_epi32(corr, _mm512_mullo_epi32(sum, _mm512_load_si512(out->sc[g])));
    }
    _mm512_store_si512(out->corr, _mm512_slli_epi32(corr, 7));
}

/* 16 decoded rows against nt tokens whose activations (offset by 128) are ap[t * cols ..]:
   out[t * os + r] = row r . token t. */
INLINE void block16_nt(const int ng, const iq_block16 *blocks, int nb, const uint8_t *ap, int cols, const hk_act *a,
                       const int nt, float *out, ptrdiff_t os) {
    const int per_group = 64 / ng;
    __m512 acc[GEMM_TILE];
    HK_UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const iq_block16 *k = blocks + b;
        __m512i isum[GEMM_TILE];
        HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_setzero_si512();
        for (int g = 0; g < ng; g++) {
            __m512i gs[GEMM_TILE];
            HK_UNROLL for (int t = 0; t < nt; t++) gs[t] = _mm512_setzero_si512();
            for (int j = 0; j < per_group; j++) {
                const int k4 = g * per_group + j;
                const __m512i wv = _mm512_load_si512(k->q[k4]);
                HK_UNROLL for (int t = 0; t < nt; t++) {
                    int32_t word;
                    memcpy(&word, ap + (size_t)t * cols + 256 * b + 4 * k4, 4);
                    gs[t] = _mm512_dpbusd_epi32(gs[t], _mm512_set1_epi32(word), wv);
                }
            }
            const __m512i sc = _mm512_load_si512(k->sc[g]);
            HK_UNROLL for (int t = 0; t < nt; t++) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(gs[t], sc));
        }
        const __m512i corr = _mm512_load_si512(k->corr);
        const __m512 dw = _mm512_load_ps(k->dw);
        HK_UNROLL for (int t = 0; t < nt; t++) {
            __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a[t].d[b]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[t], corr)), scale, acc[t]);
        }
    }
    HK_UNROLL for (int t = 0; t < nt; t++) _mm512_storeu_ps(out + t * os, acc[t]);
}

#define BLOCK16_NG(ng)                                                                                         \
    static void block16_ng##ng(const iq_block16 *blocks, int nb, const uint8_t *ap, int cols, const hk_act *a, \
                               int nt, float *out, ptrdiff_t os) {                                             \
        switch (nt) {                                                                                          \
        case 1: block16_nt(ng, blocks, nb, ap, cols, a, 1, out, os); break;                                    \
        case 2: block16_nt(ng, blocks, nb, ap, cols, a, 2, out, os); break;                                    \
        case 3: block16_nt(ng, blocks, nb, ap, cols, a, 3, out, os); break;                                    \
        case 4: block16_nt(ng, blocks, nb, ap, cols, a, 4, out, os); break;                                    \
        case 5: block16_nt(ng, blocks, nb, ap, cols, a, 5, out, os); break;                                    \
        case 6: block16_nt(ng, blocks, nb, ap, cols, a, 6, out, os); break;                                    \
        case 7: block16_nt(ng, blocks, nb, ap, cols, a, 7, out, os); break;                                    \
        case 8: block16_nt(ng, blocks, nb, ap, cols, a, 8, out, os); break;                                    \
        default: break;                                                                                        \
        }                                                                                                      \
    }
BLOCK16_NG(8)
BLOCK16_NG(16)

/* Each pool thread's decoded rows and offset activations, grown on demand and kept for the next product. */
static __thread void *WORK;
static __thread size_t WORK_SIZE;

static void *work(size_t need) {
    if (need <= WORK_SIZE) return WORK;
    void *p = NULL;
    if (posix_memalign(&p, 64, need) != 0) return NULL;
    free(WORK);
    WORK = p;
    WORK_SIZE = need;
    return p;
}

static hk_dot_fn row_kernel(int type) {
    switch (type) {
    case HK_IQ2_XXS: return FN(dot_iq2_xxs);
    case HK_IQ2_XS: return FN(dot_iq2_xs);
    case HK_IQ2_S: return FN(dot_iq2_s);
    case HK_IQ3_XXS: return FN(dot_iq3_xxs);
    case HK_IQ3_S: return FN(dot_iq3_s);
    case HK_IQ4_XS: return FN(dot_iq4_xs);
    default: return NULL;
    }
}

/* Offset activations of nt tokens: ap[t * cols + j] = acts[t].qs[j] + 128. */
static void offset_acts(const hk_act *acts, int nt, int cols, uint8_t *ap) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < cols; j += 64)
            _mm512_store_si512(ap + (size_t)t * cols + j, _mm512_xor_si512(_mm512_loadu_si512(acts[t].qs + j), flip));
}

static int iq_rows_avx512(int type, const uint8_t *w, ptrdiff_t stride, int r0, int r1, int cols, const hk_act *acts,
                          int n, float *out, int rows) {
    const int nb = cols / HK_QK_K, groups = (r1 - r0) / 16, ng = groups_of(type);
    const size_t decoded = sizeof(iq_block16) * (size_t)nb * (size_t)groups;
    uint8_t *mem = work(decoded + (size_t)GEMM_TILE * (size_t)cols);
    if (!mem) return -1;
    iq_block16 *blocks = (iq_block16 *)(void *)mem;
    uint8_t *ap = mem + decoded;
    for (int g = 0; g < groups; g++)
        for (int b = 0; b < nb; b++) decode_block16(type, w + (ptrdiff_t)(r0 + 16 * g) * stride, stride, b, blocks + (size_t)g * nb + b);
    const hk_dot_fn dot = row_kernel(type);
    for (int t0 = 0; t0 < n; t0 += GEMM_TILE) {
        const int nt = n - t0 < GEMM_TILE ? n - t0 : GEMM_TILE;
        float *o = out + (size_t)t0 * rows;
        offset_acts(acts + t0, nt, cols, ap);
        for (int g = 0; g < groups; g++)
            (ng == 8 ? block16_ng8 : block16_ng16)(blocks + (size_t)g * nb, nb, ap, cols, acts + t0, nt, o + r0 + 16 * g, rows);
        for (int r = r0 + 16 * groups; r < r1; r++) dot(nb, w + (ptrdiff_t)r * stride, acts + t0, nt, o + r, rows);
    }
    return 0;
}

hk_rows_fn hk_iq_rows(const hk_isa *isa, int type, int n) {
    return isa == &hk_isa_avx512 && n >= HK_IQ_GEMM_MIN_TOKENS && row_kernel(type) ? iq_rows_avx512 : NULL;
}

hk_dot_fn hk_iq_dot(const hk_isa *isa, int type) { return isa == &hk_isa_avx512 ? row_kernel(type) : NULL; }

#if defined(__clang__)
#pragma clang attribute pop
#endif

#else /* not x86-64: the row loop with each ISA's own kernels */

hk_rows_fn hk_iq_rows(const hk_isa *isa, int type, int n) { (void)isa, (void)type, (void)n; return NULL; }
hk_dot_fn hk_iq_dot(const hk_isa *isa, int type) { (void)isa, (void)type; return NULL; }

#endif
