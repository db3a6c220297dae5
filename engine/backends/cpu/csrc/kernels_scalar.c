/* Portable scalar kernels: the type table, activation quantization, integer dot products, dequantization. */
#include <math.h>

#include "hk.h"

static const hk_type TYPES[] = {
    {HK_F32, "F32", 1, 4, HK_ACT_F32},       {HK_F16, "F16", 1, 2, HK_ACT_F32},
    {HK_BF16, "BF16", 1, 2, HK_ACT_F32},     {HK_Q4_0, "Q4_0", 32, 18, HK_ACT_Q8_32},
    {HK_Q4_1, "Q4_1", 32, 20, HK_ACT_Q8_32}, {HK_Q5_0, "Q5_0", 32, 22, HK_ACT_Q8_32},
    {HK_Q5_1, "Q5_1", 32, 24, HK_ACT_Q8_32}, {HK_Q8_0, "Q8_0", 32, 34, HK_ACT_Q8_32},
    {HK_Q2_K, "Q2_K", 256, 84, HK_ACT_Q8_K}, {HK_Q3_K, "Q3_K", 256, 110, HK_ACT_Q8_K},
    {HK_Q4_K, "Q4_K", 256, 144, HK_ACT_Q8_K}, {HK_Q5_K, "Q5_K", 256, 176, HK_ACT_Q8_K},
    {HK_Q6_K, "Q6_K", 256, 210, HK_ACT_Q8_K}, {HK_TQ1_0, "TQ1_0", 256, 54, HK_ACT_Q8_K},
    {HK_TQ2_0, "TQ2_0", 256, 66, HK_ACT_Q8_K}, {HK_IQ4_NL, "IQ4_NL", 32, 18, HK_ACT_Q8_32},
    {HK_MXFP4, "MXFP4", 32, 17, HK_ACT_Q8_32}, {HK_IQ4_XS, "IQ4_XS", 256, 136, HK_ACT_Q8_K},
    {HK_IQ2_XXS, "IQ2_XXS", 256, 66, HK_ACT_Q8_K}, {HK_IQ2_XS, "IQ2_XS", 256, 74, HK_ACT_Q8_K},
    {HK_IQ2_S, "IQ2_S", 256, 82, HK_ACT_Q8_K}, {HK_IQ3_XXS, "IQ3_XXS", 256, 98, HK_ACT_Q8_K},
    {HK_IQ3_S, "IQ3_S", 256, 110, HK_ACT_Q8_K},
    {HK_Q4_0_R16, "Q4_0_R16", 32, 18, HK_ACT_Q8_32}, {HK_IQ4_NL_R16, "IQ4_NL_R16", 32, 18, HK_ACT_Q8_32},
    {HK_Q4_K_R16, "Q4_K_R16", 256, 144, HK_ACT_Q8_K}, {HK_Q8_0_R16, "Q8_0_R16", 32, 34, HK_ACT_Q8_32},
    {HK_Q6_K_R16, "Q6_K_R16", 256, 210, HK_ACT_Q8_K},
};

const hk_type *hk_type_info(int id) {
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (TYPES[i].id == id) return &TYPES[i];
    return NULL;
}

float hk_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise the mantissa */
        exp = 113;
        while (!(man & 0x400)) { man <<= 1; exp--; }
        bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float f16(const uint8_t *p) { return hk_f16_to_f32(hk_u16(p)); }

/* Element j of a float row of the given type (rows need not be aligned). */
static float float_elem(int type, const uint8_t *w, int j) {
    float v;
    if (type == HK_F32) { memcpy(&v, w + 4 * j, 4); return v; }
    return type == HK_F16 ? f16(w + 2 * j) : hk_bf16_to_f32(hk_u16(w + 2 * j));
}

/* -- activation quantization: d = amax / 127, q = round-half-even(x * 127 / amax), as the SIMD paths do */

static float block_amax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

void hk_scalar_quant32(const float *x, int cols, int8_t *qs, float *d, float *ds) {
    for (int b = 0; b < cols / HK_QK; b++) {
        const float *xb = x + b * HK_QK;
        float amax = block_amax(xb, HK_QK), id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < HK_QK; j++) {
            int q = (int)nearbyintf(xb[j] * id);
            qs[b * HK_QK + j] = (int8_t)q;
            sum += q;
        }
        d[b] = amax / 127.0f;
        ds[b] = d[b] * (float)sum;
    }
}

void hk_scalar_quantK(const float *x, int cols, int8_t *qs, float *d, int16_t *bsums) {
    for (int b = 0; b < cols / HK_QK_K; b++) {
        const float *xb = x + b * HK_QK_K;
        float amax = block_amax(xb, HK_QK_K), id = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int g = 0; g < HK_QK_K / 16; g++) {
            int sum = 0;
            for (int j = g * 16; j < g * 16 + 16; j++) {
                int q = (int)nearbyintf(xb[j] * id);
                qs[b * HK_QK_K + j] = (int8_t)q;
                sum += q;
            }
            bsums[b * 16 + g] = (int16_t)sum;
        }
        d[b] = amax / 127.0f;
    }
}

/* -- weight blocks decoded to small integers: one function per type fills q[] (and the block's scales) */

/* Legacy 32-blocks: q[32] unsigned 4- or 5-bit codes. */
static void codes_q4(const uint8_t *qs, int8_t *q) {
    for (int j = 0; j < 16; j++) { q[j] = (int8_t)(qs[j] & 0xF); q[j + 16] = (int8_t)(qs[j] >> 4); }
}

static void codes_q5(const uint8_t *qhp, const uint8_t *qs, int8_t *q) {
    uint32_t qh = hk_u32(qhp);
    codes_q4(qs, q);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)(q[j] | (((qh >> j) & 1) << 4));
}

/* IQ4_NL and MXFP4: q[32] the signed table values of the 4-bit codes. */
static void codes_table(const uint8_t *qs, const int8_t *table, int8_t *q) {
    codes_q4(qs, q);
    for (int j = 0; j < 32; j++) q[j] = table[(uint8_t)q[j]];
}

static int idot(const int8_t *a, const int8_t *b, int n) {
    int s = 0;
    for (int j = 0; j < n; j++) s += a[j] * b[j];
    return s;
}

/* One token's dot product for a legacy type: sum over blocks of dw * (da * idot + off * ds) (+ m * ds). */
static float dot32_one(int type, int nb, const uint8_t *w, const hk_act *a) {
    const hk_type *ti = hk_type_info(type);
    float sum = 0.0f;
    int8_t q[32];
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * ti->type_size;
        const int8_t *aq = a->qs + b * HK_QK;
        float dw = type == HK_MXFP4 ? hk_e8m0_half(blk[0]) : f16(blk), da = a->d[b], ds = a->ds[b];
        switch (type) {
        case HK_IQ4_NL: codes_table(blk + 2, hk_kvalues_iq4nl, q); sum += dw * da * idot(q, aq, 32); break;
        case HK_MXFP4: codes_table(blk + 1, hk_kvalues_mxfp4, q); sum += dw * da * idot(q, aq, 32); break;
        case HK_Q4_0: codes_q4(blk + 2, q); sum += dw * (da * idot(q, aq, 32) - 8.0f * ds); break;
        case HK_Q4_1: codes_q4(blk + 4, q); sum += dw * da * idot(q, aq, 32) + f16(blk + 2) * ds; break;
        case HK_Q5_0: codes_q5(blk + 2, blk + 6, q); sum += dw * (da * idot(q, aq, 32) - 16.0f * ds); break;
        case HK_Q5_1: codes_q5(blk + 4, blk + 8, q); sum += dw * da * idot(q, aq, 32) + f16(blk + 2) * ds; break;
        case HK_Q8_0: sum += dw * da * idot((const int8_t *)(blk + 2), aq, 32); break;
        }
    }
    return sum;
}

/* K-quants decoded to codes q[256] (unsigned, before any offset), per-16 integer scales sc[16] and mins
   mn[16], and float multipliers dw (of sc) and dm (of mn); value = dw * sc * (q - off) - dm * mn.
   The IQ types decode to signed values (table entries, or grid values with their signs) with off = 0. */
typedef struct {
    int8_t q[256];
    int sc[16], mn[16], off;
    float dw, dm;
} kblock;

static void decode_q2_k(const uint8_t *blk, kblock *k) {
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++) k->q[128 * h + 32 * s + l] = (int8_t)((blk[16 + 32 * h + l] >> (2 * s)) & 3);
    for (int i = 0; i < 16; i++) { k->sc[i] = blk[i] & 0xF; k->mn[i] = blk[i] >> 4; }
    k->off = 0; k->dw = f16(blk + 80); k->dm = f16(blk + 82);
}

static void decode_q3_k(const uint8_t *blk, kblock *k) {
    int8_t sc[16];
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++) { /* element 128h + 32s + l: hmask bit 4h + s */
                int low = (blk[32 + 32 * h + l] >> (2 * s)) & 3, hb = (blk[l] >> (4 * h + s)) & 1;
                k->q[128 * h + 32 * s + l] = (int8_t)(low | (hb << 2));
            }
    hk_unpack_q3k_scales(blk + 96, sc);
    for (int i = 0; i < 16; i++) { k->sc[i] = sc[i]; k->mn[i] = 0; }
    k->off = 4; k->dw = f16(blk + 108); k->dm = 0.0f;
}

static void decode_q45_k(const uint8_t *blk, kblock *k, int five) {
    uint8_t sc[8], mn[8];
    const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = qs[32 * c + l] & 0xF, hi = qs[32 * c + l] >> 4;
            if (five) { lo |= ((qh[l] >> (2 * c)) & 1) << 4; hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4; }
            k->q[64 * c + l] = (int8_t)lo;
            k->q[64 * c + 32 + l] = (int8_t)hi;
        }
    hk_unpack_k4_scales(blk + 4, sc, mn);
    for (int i = 0; i < 16; i++) { k->sc[i] = sc[i / 2]; k->mn[i] = mn[i / 2]; }
    k->off = 0; k->dw = f16(blk); k->dm = f16(blk + 2);
}

static void decode_q6_k(const uint8_t *blk, kblock *k) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
        for (int l = 0; l < 32; l++) {
            k->q[128 * h + l] = (int8_t)((ql[l] & 0xF) | ((qh[l] & 3) << 4));
            k->q[128 * h + 32 + l] = (int8_t)((ql[32 + l] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            k->q[128 * h + 64 + l] = (int8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            k->q[128 * h + 96 + l] = (int8_t)((ql[32 + l] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
    for (int i = 0; i < 16; i++) { k->sc[i] = (int8_t)blk[192 + i]; k->mn[i] = 0; }
    k->off = 32; k->dw = f16(blk + 208); k->dm = 0.0f;
}

static void decode_tq2_0(const uint8_t *blk, kblock *k) {
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++) k->q[128 * h + 32 * s + l] = (int8_t)((blk[32 * h + l] >> (2 * s)) & 3);
    for (int i = 0; i < 16; i++) { k->sc[i] = 1; k->mn[i] = 0; }
    k->off = 1; k->dw = f16(blk + 64); k->dm = 0.0f;
}

static void decode_tq1_0(const uint8_t *blk, kblock *k) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    for (int p = 0; p < 5; p++) {
        for (int l = 0; l < 32; l++) k->q[32 * p + l] = (int8_t)hk_trit(blk[l], pow3[p]);
        for (int l = 0; l < 16; l++) k->q[160 + 16 * p + l] = (int8_t)hk_trit(blk[32 + l], pow3[p]);
    }
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 4; l++) k->q[240 + 4 * p + l] = (int8_t)hk_trit(blk[48 + l], pow3[p]);
    for (int i = 0; i < 16; i++) { k->sc[i] = 1; k->mn[i] = 0; }
    k->off = 1; k->dw = f16(blk + 52); k->dm = 0.0f;
}

/* -- IQ types: every value is dw * sc * q with q a signed table or grid value */

static void decode_iq4_xs(const uint8_t *blk, kblock *k) {
    uint16_t sh = hk_u16(blk + 2);
    for (int ib = 0; ib < 8; ib++) {
        int ls = ((blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
        codes_table(blk + 8 + 16 * ib, hk_kvalues_iq4nl, k->q + 32 * ib);
        k->sc[2 * ib] = k->sc[2 * ib + 1] = ls - 32;
    }
    for (int i = 0; i < 16; i++) k->mn[i] = 0;
    k->off = 0; k->dw = f16(blk); k->dm = 0.0f;
}

/* Eight grid bytes with the signs of sign byte s applied. */
static void signed_grid8(const uint8_t *grid, uint8_t s, int8_t *q) {
    for (int j = 0; j < 8; j++) q[j] = (int8_t)((s >> j) & 1 ? -grid[j] : grid[j]);
}

/* IQ2_XS / IQ2_S scales: a byte per 32 elements, 2 * nibble + 1 for each 16 (low nibble first). */
static void iq_scales16(const uint8_t *scales, kblock *k) {
    for (int i = 0; i < 16; i++) {
        k->sc[i] = 2 * ((scales[i / 2] >> (4 * (i % 2))) & 0xF) + 1;
        k->mn[i] = 0;
    }
}

static void decode_iq2_xxs(const uint8_t *blk, kblock *k) {
    for (int ib = 0; ib < 8; ib++) { /* 8 bytes: four grid indices, then 4 x 7 sign bits and a 4-bit scale */
        const uint8_t *p = blk + 2 + 8 * ib;
        uint32_t aux = hk_u32(p + 4);
        for (int l = 0; l < 4; l++)
            signed_grid8((const uint8_t *)&hk_iq2xxs_grid[p[l]], hk_ksigns[(aux >> (7 * l)) & 127], k->q + 32 * ib + 8 * l);
        k->sc[2 * ib] = k->sc[2 * ib + 1] = 2 * (int)(aux >> 28) + 1;
    }
    for (int i = 0; i < 16; i++) k->mn[i] = 0;
    k->off = 0; k->dw = 0.125f * f16(blk); k->dm = 0.0f;
}

static void decode_iq2_xs(const uint8_t *blk, kblock *k) {
    for (int g = 0; g < 32; g++) { /* 16-bit words: 9-bit grid index, 7 sign bits */
        uint16_t v = hk_u16(blk + 2 + 2 * g);
        signed_grid8((const uint8_t *)&hk_iq2xs_grid[v & 511], hk_ksigns[v >> 9], k->q + 8 * g);
    }
    iq_scales16(blk + 66, k);
    k->off = 0; k->dw = 0.125f * f16(blk); k->dm = 0.0f;
}

static void decode_iq2_s(const uint8_t *blk, kblock *k) {
    const uint8_t *qs = blk + 2, *signs = blk + 34, *qh = blk + 66;
    for (int g = 0; g < 32; g++) { /* grid index: 8 bits in qs, 2 more in qh; one whole sign byte */
        int idx = qs[g] | (((qh[g / 4] >> (2 * (g % 4))) & 3) << 8);
        signed_grid8((const uint8_t *)&hk_iq2s_grid[idx], signs[g], k->q + 8 * g);
    }
    iq_scales16(blk + 74, k);
    k->off = 0; k->dw = 0.125f * f16(blk); k->dm = 0.0f;
}

/* Two 4-value grid entries with the signs of sign byte s applied. */
static void signed_grid4x2(uint32_t g0, uint32_t g1, uint8_t s, int8_t *q) {
    uint8_t v[8];
    memcpy(v, &g0, 4);
    memcpy(v + 4, &g1, 4);
    signed_grid8(v, s, q);
}

static void decode_iq3_xxs(const uint8_t *blk, kblock *k) {
    const uint8_t *qs = blk + 2, *ss = blk + 66;
    for (int ib = 0; ib < 8; ib++) { /* 8 grid indices per 32; 4 x 7 sign bits and a 4-bit scale in a word */
        uint32_t aux = hk_u32(ss + 4 * ib);
        for (int l = 0; l < 4; l++)
            signed_grid4x2(hk_iq3xxs_grid[qs[8 * ib + 2 * l]], hk_iq3xxs_grid[qs[8 * ib + 2 * l + 1]],
                           hk_ksigns[(aux >> (7 * l)) & 127], k->q + 32 * ib + 8 * l);
        k->sc[2 * ib] = k->sc[2 * ib + 1] = 2 * (int)(aux >> 28) + 1;
    }
    for (int i = 0; i < 16; i++) k->mn[i] = 0;
    k->off = 0; k->dw = 0.25f * f16(blk); k->dm = 0.0f;
}

static void decode_iq3_s(const uint8_t *blk, kblock *k) {
    const uint8_t *qs = blk + 2, *qh = blk + 66, *signs = blk + 74;
    for (int g = 0; g < 32; g++) { /* grid indices: 8 bits in qs, a ninth in qh; one whole sign byte */
        int i0 = qs[2 * g] | (((qh[g / 4] >> (2 * (g % 4))) & 1) << 8);
        int i1 = qs[2 * g + 1] | (((qh[g / 4] >> (2 * (g % 4) + 1)) & 1) << 8);
        signed_grid4x2(hk_iq3s_grid[i0], hk_iq3s_grid[i1], signs[g], k->q + 8 * g);
    }
    for (int i = 0; i < 16; i++) { /* one 4-bit scale per 32 elements */
        k->sc[i] = 2 * ((blk[106 + i / 4] >> (4 * ((i / 2) % 2))) & 0xF) + 1;
        k->mn[i] = 0;
    }
    k->off = 0; k->dw = f16(blk); k->dm = 0.0f;
}

static void decode_k(int type, const uint8_t *blk, kblock *k) {
    switch (type) {
    case HK_Q2_K: decode_q2_k(blk, k); break;
    case HK_Q3_K: decode_q3_k(blk, k); break;
    case HK_Q4_K: decode_q45_k(blk, k, 0); break;
    case HK_Q5_K: decode_q45_k(blk, k, 1); break;
    case HK_Q6_K: decode_q6_k(blk, k); break;
    case HK_TQ1_0: decode_tq1_0(blk, k); break;
    case HK_TQ2_0: decode_tq2_0(blk, k); break;
    case HK_IQ4_XS: decode_iq4_xs(blk, k); break;
    case HK_IQ2_XXS: decode_iq2_xxs(blk, k); break;
    case HK_IQ2_XS: decode_iq2_xs(blk, k); break;
    case HK_IQ2_S: decode_iq2_s(blk, k); break;
    case HK_IQ3_XXS: decode_iq3_xxs(blk, k); break;
    case HK_IQ3_S: decode_iq3_s(blk, k); break;
    }
}

static float dotk_one(int type, int nb, const uint8_t *w, const hk_act *a) {
    int ts = hk_type_info(type)->type_size;
    float sum = 0.0f;
    kblock k;
    for (int b = 0; b < nb; b++) {
        decode_k(type, w + (size_t)b * ts, &k);
        const int8_t *aq = a->qs + b * HK_QK_K;
        const int16_t *bs = a->bsums + b * 16;
        int isum = 0, msum = 0;
        for (int i = 0; i < 16; i++) {
            isum += k.sc[i] * (idot(k.q + 16 * i, aq + 16 * i, 16) - k.off * bs[i]);
            msum += k.mn[i] * bs[i];
        }
        sum += a->d[b] * (k.dw * (float)isum - k.dm * (float)msum);
    }
    return sum;
}

static float dotf_one(int type, int cols, const uint8_t *w, const float *x) {
    float acc[4] = {0, 0, 0, 0};
    for (int j = 0; j < cols; j++) {
        acc[j & 3] += float_elem(type, w, j) * x[j];
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

#define SCALAR_DOT(fname, type, body)                                                            \
    static void fname(int nb, const uint8_t *w, const hk_act *a, int nt, float *out, ptrdiff_t os) { \
        for (int t = 0; t < nt; t++) out[t * os] = body;                                         \
    }

SCALAR_DOT(dot_f32, HK_F32, dotf_one(HK_F32, nb, w, a[t].f))
SCALAR_DOT(dot_f16, HK_F16, dotf_one(HK_F16, nb, w, a[t].f))
SCALAR_DOT(dot_bf16, HK_BF16, dotf_one(HK_BF16, nb, w, a[t].f))
SCALAR_DOT(dot_q4_0, HK_Q4_0, dot32_one(HK_Q4_0, nb, w, &a[t]))
SCALAR_DOT(dot_q4_1, HK_Q4_1, dot32_one(HK_Q4_1, nb, w, &a[t]))
SCALAR_DOT(dot_q5_0, HK_Q5_0, dot32_one(HK_Q5_0, nb, w, &a[t]))
SCALAR_DOT(dot_q5_1, HK_Q5_1, dot32_one(HK_Q5_1, nb, w, &a[t]))
SCALAR_DOT(dot_q8_0, HK_Q8_0, dot32_one(HK_Q8_0, nb, w, &a[t]))
SCALAR_DOT(dot_q2_k, HK_Q2_K, dotk_one(HK_Q2_K, nb, w, &a[t]))
SCALAR_DOT(dot_q3_k, HK_Q3_K, dotk_one(HK_Q3_K, nb, w, &a[t]))
SCALAR_DOT(dot_q4_k, HK_Q4_K, dotk_one(HK_Q4_K, nb, w, &a[t]))
SCALAR_DOT(dot_q5_k, HK_Q5_K, dotk_one(HK_Q5_K, nb, w, &a[t]))
SCALAR_DOT(dot_q6_k, HK_Q6_K, dotk_one(HK_Q6_K, nb, w, &a[t]))
SCALAR_DOT(dot_tq1_0, HK_TQ1_0, dotk_one(HK_TQ1_0, nb, w, &a[t]))
SCALAR_DOT(dot_tq2_0, HK_TQ2_0, dotk_one(HK_TQ2_0, nb, w, &a[t]))
SCALAR_DOT(dot_iq4_nl, HK_IQ4_NL, dot32_one(HK_IQ4_NL, nb, w, &a[t]))
SCALAR_DOT(dot_mxfp4, HK_MXFP4, dot32_one(HK_MXFP4, nb, w, &a[t]))
SCALAR_DOT(dot_iq4_xs, HK_IQ4_XS, dotk_one(HK_IQ4_XS, nb, w, &a[t]))
SCALAR_DOT(dot_iq2_xxs, HK_IQ2_XXS, dotk_one(HK_IQ2_XXS, nb, w, &a[t]))
SCALAR_DOT(dot_iq2_xs, HK_IQ2_XS, dotk_one(HK_IQ2_XS, nb, w, &a[t]))
SCALAR_DOT(dot_iq2_s, HK_IQ2_S, dotk_one(HK_IQ2_S, nb, w, &a[t]))
SCALAR_DOT(dot_iq3_xxs, HK_IQ3_XXS, dotk_one(HK_IQ3_XXS, nb, w, &a[t]))
SCALAR_DOT(dot_iq3_s, HK_IQ3_S, dotk_one(HK_IQ3_S, nb, w, &a[t]))

const hk_isa hk_isa_scalar = {
    .name = "scalar",
    .dot = {
        [HK_F32] = dot_f32, [HK_F16] = dot_f16, [HK_BF16] = dot_bf16, [HK_Q4_0] = dot_q4_0,
        [HK_Q4_1] = dot_q4_1, [HK_Q5_0] = dot_q5_0, [HK_Q5_1] = dot_q5_1, [HK_Q8_0] = dot_q8_0,
        [HK_Q2_K] = dot_q2_k, [HK_Q3_K] = dot_q3_k, [HK_Q4_K] = dot_q4_k, [HK_Q5_K] = dot_q5_k,
        [HK_Q6_K] = dot_q6_k, [HK_TQ1_0] = dot_tq1_0, [HK_TQ2_0] = dot_tq2_0, [HK_IQ4_NL] = dot_iq4_nl,
        [HK_MXFP4] = dot_mxfp4, [HK_IQ4_XS] = dot_iq4_xs, [HK_IQ2_XXS] = dot_iq2_xxs, [HK_IQ2_XS] = dot_iq2_xs,
        [HK_IQ2_S] = dot_iq2_s, [HK_IQ3_XXS] = dot_iq3_xxs, [HK_IQ3_S] = dot_iq3_s,
    },
    .quant32 = hk_scalar_quant32,
    .quantK = hk_scalar_quantK,
};

/* -- dequantization of whole rows (embedding look-ups and tests) */

static void dequant32_block(int type, const uint8_t *blk, float *out) {
    int8_t q[32];
    float d = type == HK_MXFP4 ? hk_e8m0_half(blk[0]) : f16(blk), m = 0.0f;
    int off = 0;
    switch (type) {
    case HK_IQ4_NL: codes_table(blk + 2, hk_kvalues_iq4nl, q); break;
    case HK_MXFP4: codes_table(blk + 1, hk_kvalues_mxfp4, q); break;
    case HK_Q4_0: codes_q4(blk + 2, q); off = 8; break;
    case HK_Q4_1: codes_q4(blk + 4, q); m = f16(blk + 2); break;
    case HK_Q5_0: codes_q5(blk + 2, blk + 6, q); off = 16; break;
    case HK_Q5_1: codes_q5(blk + 4, blk + 8, q); m = f16(blk + 2); break;
    case HK_Q8_0: memcpy(q, blk + 2, 32); break;
    }
    for (int j = 0; j < 32; j++) out[j] = d * (float)(q[j] - off) + m;
}

int hk_dequantize_row(int type, const uint8_t *w, int cols, float *out) {
    const hk_type *ti = hk_type_info(type);
    if (!ti || hk_is_r16(type)) return -1; /* a repacked row is spread over its group: hk_matrix_row */
    if (ti->act == HK_ACT_F32) {
        for (int j = 0; j < cols; j++) out[j] = float_elem(type, w, j);
    } else if (ti->act == HK_ACT_Q8_32) {
        for (int b = 0; b < cols / HK_QK; b++) dequant32_block(type, w + (size_t)b * ti->type_size, out + b * HK_QK);
    } else {
        kblock k;
        for (int b = 0; b < cols / HK_QK_K; b++) {
            decode_k(type, w + (size_t)b * ti->type_size, &k);
            for (int e = 0; e < 256; e++)
                out[b * 256 + e] = k.dw * (float)(k.sc[e / 16] * (k.q[e] - k.off)) - k.dm * (float)k.mn[e / 16];
        }
    }
    return 0;
}
