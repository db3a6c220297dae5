/* The 16-row layout of Q4_0 and IQ4_NL (see hk.h): the repacking done once at load, and a portable kernel for
   a repacked matrix under an ISA without 16-row kernels for it. */
#include "hk.h"
#include "pool.h"

/* Where piece k (0: the float16 scale, 1-4: code bytes 4(k-1)..4k-1) of row r's 18-byte block lies in the file
   layout and in its group's 16-row block, and its length: the layout's one statement of where bytes go. */
static int file_at(int k) { return k ? 4 * k - 2 : 0; }
static int group_at(int k, int r) { return k ? 32 + 64 * (k - 1) + 4 * r : 2 * r; }
static int piece_len(int k) { return k ? 4 : 2; }

typedef struct {
    const uint8_t *src;
    ptrdiff_t stride;
    int nb;
    uint8_t *dst;
} repack_job;

/* One group of 16 rows (a pool task). */
static void repack_group(void *ctx, int task) {
    const repack_job *j = ctx;
    const uint8_t *in = j->src + (ptrdiff_t)16 * task * j->stride;
    uint8_t *out = j->dst + (ptrdiff_t)16 * task * j->nb * 18;
    for (int b = 0; b < j->nb; b++, out += HK_R16_BLOCK)
        for (int r = 0; r < 16; r++)
            for (int k = 0; k < 5; k++)
                memcpy(out + group_at(k, r), in + (ptrdiff_t)r * j->stride + (ptrdiff_t)b * 18 + file_at(k), piece_len(k));
}

void hk_repack16(const uint8_t *src, ptrdiff_t stride, int rows, int nb, uint8_t *dst) {
    repack_job j = {src, stride, nb, dst};
    hk_pool_run(repack_group, &j, rows / 16);
}

#define CHUNK_BLOCKS 128 /* a row is put back together this many blocks at a time, on the stack */

/* Blocks b0 .. b0 + n - 1 of row r of the repacked group at w, in the file layout (18 bytes each) at row. */
static void gather_row(const uint8_t *w, int r, int b0, int n, uint8_t *row) {
    for (int b = 0; b < n; b++)
        for (int k = 0; k < 5; k++) memcpy(row + 18 * b + file_at(k), w + (size_t)(b0 + b) * HK_R16_BLOCK + group_at(k, r), piece_len(k));
}

int hk_matrix_row(int type, const uint8_t *w, ptrdiff_t stride, ptrdiff_t id, int cols, float *out) {
    if (!hk_is_r16(type)) return hk_dequantize_row(type, w + id * stride, cols, out);
    const uint8_t *group = w + (id - id % 16) * stride;
    uint8_t row[CHUNK_BLOCKS * 18];
    for (int b0 = 0; b0 < cols / HK_QK; b0 += CHUNK_BLOCKS) {
        const int n = cols / HK_QK - b0 < CHUNK_BLOCKS ? cols / HK_QK - b0 : CHUNK_BLOCKS;
        gather_row(group, (int)(id % 16), b0, n, row);
        if (hk_dequantize_row(hk_r16_base(type), row, n * HK_QK, out + (size_t)b0 * HK_QK) != 0) return -1;
    }
    return 0;
}

/* Row r of a repacked group back in the file layout, a chunk at a time, through the type's scalar dot. A
   fallback only (a matrix repacked for AVX-512, then the ISA switched): its sums are not the 16-row kernel's
   bits. */
static void scalar_rows16_r16(const int type, int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os) {
    const hk_dot_fn dot = hk_isa_scalar.dot[hk_r16_base(type)];
    uint8_t row[CHUNK_BLOCKS * 18];
    (void)stride;
    for (int r = 0; r < 16; r++) {
        float sum[HK_MAX_NT] = {0};
        for (int b0 = 0; b0 < nb; b0 += CHUNK_BLOCKS) {
            const int n = nb - b0 < CHUNK_BLOCKS ? nb - b0 : CHUNK_BLOCKS;
            gather_row(w, r, b0, n, row);
            hk_act part[HK_MAX_NT];
            for (int t = 0; t < nt; t++) /* the activations of these blocks */
                part[t] = (hk_act){.qs = a[t].qs + b0 * HK_QK, .d = a[t].d + b0, .ds = a[t].ds + b0};
            float got[HK_MAX_NT];
            dot(n, row, part, nt, got, 1);
            for (int t = 0; t < nt; t++) sum[t] += got[t];
        }
        for (int t = 0; t < nt; t++) out[t * os + r] = sum[t];
    }
}

void hk_scalar_rows16_q4_0_r16(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os) {
    scalar_rows16_r16(HK_Q4_0_R16, nb, w, stride, a, nt, out, os);
}

void hk_scalar_rows16_iq4_nl_r16(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os) {
    scalar_rows16_r16(HK_IQ4_NL_R16, nb, w, stride, a, nt, out, os);
}
