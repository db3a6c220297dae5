/* Cross-check of the CPU kernels without Python: every ISA this CPU runs against the scalar kernels, on
   random blocks of every type, awkward sizes and token counts. Built and run by test_cpu_kernels.py; also
   the way to check the arm64 kernels on an x86 machine (cross-compile statically, run under qemu-aarch64, as
   test_cpu_kernels_neon.py does):
     aarch64-linux-gnu-gcc -O2 -static -pthread -Iengine/backends/cpu/csrc \
       tests/engine/cpu_kernels_crosscheck.c engine/backends/cpu/csrc/{matmul,pool,kernels_*}.c -lm
   Prints one line per ISA and exits non-zero on the first mismatch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "matmul.h"
#include "pool.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float rnd_normalish(void) { return ((float)(rnd() % 20001) - 10000.0f) / 5000.0f; }

/* Byte offsets of the float16 scales in each block; every other byte may take any value. */
static int scale_fields(int type, int *off) {
    switch (type) {
    case HK_Q4_0: case HK_Q5_0: case HK_Q8_0: case HK_IQ4_NL: case HK_IQ4_XS: case HK_IQ2_XXS: case HK_IQ2_XS:
    case HK_IQ2_S: case HK_IQ3_XXS: case HK_IQ3_S: off[0] = 0; return 1;
    case HK_Q4_1: case HK_Q5_1: case HK_Q4_K: case HK_Q5_K: off[0] = 0; off[1] = 2; return 2;
    case HK_Q2_K: off[0] = 80; off[1] = 82; return 2;
    case HK_Q3_K: off[0] = 108; return 1;
    case HK_Q6_K: off[0] = 208; return 1;
    case HK_TQ1_0: off[0] = 52; return 1;
    case HK_TQ2_0: off[0] = 64; return 1;
    }
    return 0;
}

static void random_row(int type, uint8_t *w, size_t row_bytes) {
    const hk_type *ti = hk_type_info(type);
    if (type == HK_F32) {
        for (size_t j = 0; j < row_bytes / 4; j++) { float v = rnd_normalish(); memcpy(w + 4 * j, &v, 4); }
        return;
    }
    if (type == HK_F16 || type == HK_BF16) { /* finite values of moderate size, either sign */
        for (size_t j = 0; j < row_bytes / 2; j++) {
            uint16_t h = type == HK_F16 ? (uint16_t)(0x3000 + rnd() % 0x0C00) : (uint16_t)(0x3E00 + rnd() % 0x0180);
            h |= (uint16_t)((rnd() & 1) << 15);
            memcpy(w + 2 * j, &h, 2);
        }
        return;
    }
    for (size_t j = 0; j < row_bytes; j++) w[j] = (uint8_t)rnd();
    int off[2], n = scale_fields(type, off);
    for (size_t b = 0; b < row_bytes / ti->type_size; b++)
        for (int k = 0; k < n; k++) { /* about 0.004 to 0.008, either sign */
            uint16_t h = (uint16_t)(0x1C00 + rnd() % 0x0400) | (uint16_t)((rnd() & 1) << 15);
            memcpy(w + b * ti->type_size + off[k], &h, 2);
        }
    if (type == HK_MXFP4) /* the e8m0 exponent byte: 2^-9 .. 2^-5 after the type's halving */
        for (size_t b = 0; b < row_bytes / ti->type_size; b++) w[b * ti->type_size] = (uint8_t)(118 + rnd() % 5);
}

static const int TYPES[] = {HK_F32, HK_F16, HK_BF16, HK_Q4_0, HK_Q4_1, HK_Q5_0, HK_Q5_1, HK_Q8_0,
                            HK_Q2_K, HK_Q3_K, HK_Q4_K, HK_Q5_K, HK_Q6_K, HK_TQ1_0, HK_TQ2_0,
                            HK_IQ4_NL, HK_MXFP4, HK_IQ4_XS, HK_IQ2_XXS, HK_IQ2_XS, HK_IQ2_S, HK_IQ3_XXS, HK_IQ3_S};
static const char *ISAS[] = {"avx2", "avxvnni", "avx512", "neon", "dotprod"};

/* One product on the named ISA and on the scalar kernels; returns the number of mismatches. */
static int compare(const char *isa, int type, int rows, int cols, int n) {
    const hk_type *ti = hk_type_info(type);
    size_t row_bytes = (size_t)cols / ti->block * ti->type_size;
    uint8_t *w = malloc(row_bytes * rows + 1);
    float *x = malloc(sizeof(float) * cols * n), *got = malloc(sizeof(float) * rows * n), *want = malloc(sizeof(float) * rows * n);
    for (int r = 0; r < rows; r++) random_row(type, w + 1 + r * row_bytes, row_bytes); /* +1: rows not aligned */
    for (int i = 0; i < cols * n; i++) x[i] = rnd_normalish() * (1 + (int)(rnd() % 8));
    hk_select_isa("scalar");
    hk_matmul(type, w + 1, (ptrdiff_t)row_bytes, rows, cols, x, n, want);
    hk_select_isa(isa);
    hk_matmul(type, w + 1, (ptrdiff_t)row_bytes, rows, cols, x, n, got);
    double scale = 0;
    for (int i = 0; i < rows * n; i++) scale = fmax(scale, fabs(want[i]));
    int bad = 0;
    for (int i = 0; i < rows * n && bad < 3; i++)
        if (!(fabs(got[i] - want[i]) <= 2e-5 * scale + 1e-4 * fabs(want[i]))) {
            printf("  %s %s rows=%d cols=%d n=%d: element %d is %.7g, scalar %.7g\n", isa, ti->name, rows, cols, n, i, got[i], want[i]);
            bad++;
        }
    free(w); free(x); free(got); free(want);
    return bad;
}

int main(void) {
    static const int ns[] = {1, 2, 3, 4, 5, 6, 7, 9};
    int failures = 0, checked = 0;
    hk_pool_set_threads(2);
    for (size_t i = 0; i < sizeof ISAS / sizeof ISAS[0]; i++) {
        if (hk_select_isa(ISAS[i]) != 0) continue; /* not this CPU */
        int cases = 0, before = failures;
        for (size_t k = 0; k < sizeof TYPES / sizeof TYPES[0]; k++) {
            const hk_type *ti = hk_type_info(TYPES[k]);
            int unit = ti->block == 1 ? 1 : ti->block;
            int shapes[][2] = {{1, unit == 1 ? 7 : unit}, {37, unit == 1 ? 261 : 3 * unit}, {130, unit == 1 ? 64 : 2 * unit}};
            for (int s = 0; s < 3; s++)
                for (size_t m = 0; m < sizeof ns / sizeof ns[0]; m++, cases++)
                    failures += compare(ISAS[i], TYPES[k], shapes[s][0], shapes[s][1], ns[m]);
        }
        printf("%s: %d cases, %d mismatches\n", ISAS[i], cases, failures - before);
        checked++;
    }
    hk_pool_shutdown();
    printf("%d ISAs checked against scalar, %s\n", checked, failures ? "FAILED" : "all agree");
    return failures ? 1 : 0;
}
