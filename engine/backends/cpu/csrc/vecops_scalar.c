/* Portable vector primitives (what a CPU without AVX2 or NEON dot products runs), and the ISA choice. */
#include "vecops.h"

#include <math.h>
#include <string.h>

#include "hk.h"
#include "matmul.h"

uint16_t hk_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u | ((ax >> 13) & 0x3FFu) : 0));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds to beyond 65504: infinity */
    if (ax < 0x38800000u) {                                  /* a float16 subnormal (or zero) */
        if (ax < 0x33000000u) return (uint16_t)sign;         /* below half the smallest subnormal */
        uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;
        int shift = 126 - (int)(ax >> 23);                   /* 14 + (113 - e) */
        uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((ax - 0x38000000u) >> 13), rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

void hk_softcap(float *x, int n, float cap) {
    const float inv = 1.0f / cap;
    for (int i = 0; i < n; i++) x[i] = cap * tanhf(x[i] * inv);
}

static void scores_scalar(const float *q, int qs, int nr, const float *k, int d, int n, float *s, int ss) {
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < n; j++) {
            const float *qr = q + (size_t)r * qs, *kj = k + (size_t)j * d;
            float acc = 0.0f;
            for (int c = 0; c < d; c++) acc += qr[c] * kj[c];
            s[(size_t)r * ss + j] = acc;
        }
}

static float max_scalar(const float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static float exp_sum_scalar(float *x, int n, float m) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    return sum;
}

static void pv_scalar(const float *p, int ps, int nr, const float *v, int dv, int n, float *o, int os) {
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < n; j++) {
            const float *vj = v + (size_t)j * dv;
            float pj = p[(size_t)r * ps + j], *orow = o + (size_t)r * os;
            for (int c = 0; c < dv; c++) orow[c] += pj * vj[c];
        }
}

static void axpby_scalar(float *o, float a, const float *x, float b, int n) {
    for (int i = 0; i < n; i++) o[i] = o[i] * a + x[i] * b;
}

static void scale_scalar(float *x, int n, float s) {
    for (int i = 0; i < n; i++) x[i] *= s;
}

static float sum_sq_scalar(const float *x, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += x[i + l] * x[i + l];
    for (; i < n; i++) acc[0] += x[i] * x[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static void scale_mul_scalar(float *y, const float *x, float s, const float *w, int n) {
    for (int i = 0; i < n; i++) y[i] = (x[i] * s) * w[i];
}

/* silu(g) = g / (1 + exp(-g)); gelu_tanh(g) = 0.5 g (1 + tanh(t)) = g / (1 + exp(-2 t)) */
static void glu_scalar(float *g, const float *u, int n, int gelu) {
    for (int i = 0; i < n; i++) {
        float x = g[i], z = gelu ? -2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x) : -x;
        g[i] = x / (1.0f + expf(z)) * u[i];
    }
}

static void f16_to_f32_scalar(const uint16_t *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] = hk_f16_to_f32(x[i]);
}

static void f32_to_f16_scalar(const float *x, uint16_t *y, int n) {
    for (int i = 0; i < n; i++) y[i] = hk_f32_to_f16(x[i]);
}

static void q8_0_to_f32_scalar(const uint8_t *x, float *y, int n_blocks) {
    for (int b = 0; b < n_blocks; b++, x += 34, y += 32) {
        const float d = hk_f16_to_f32((uint16_t)(x[0] | x[1] << 8));
        for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)x[2 + j];
    }
}

const hk_vecops hk_vecops_scalar = {
    .name = "scalar", .scores = scores_scalar, .max = max_scalar, .exp_sum = exp_sum_scalar, .pv = pv_scalar,
    .axpby = axpby_scalar, .scale = scale_scalar, .sum_sq = sum_sq_scalar, .scale_mul = scale_mul_scalar,
    .glu = glu_scalar, .f16_to_f32 = f16_to_f32_scalar, .f32_to_f16 = f32_to_f16_scalar,
    .q8_0_to_f32 = q8_0_to_f32_scalar,
};

const hk_vecops *hk_vecops_active(void) {
    const char *isa = hk_isa_name();
#if defined(__x86_64__) || defined(_M_X64)
    if (strcmp(isa, "avx512") == 0) return &hk_vecops_avx512;
    if (strcmp(isa, "avx2") == 0 || strcmp(isa, "avxvnni") == 0) return &hk_vecops_avx2;
#endif
    (void)isa;
    return &hk_vecops_scalar;
}
