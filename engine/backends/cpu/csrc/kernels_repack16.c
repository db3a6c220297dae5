/* The 16-row layouts of Q4_0, IQ4_NL, Q4_K, Q8_0 and Q6_K (see hk.h): the repacking done once at load, and a
   portable kernel for a repacked matrix under an ISA without 16-row kernels for it. */
#include "hk.h"
#include "pool.h"

/* Where each piece of a block lies in the file layout and in its group's 16-row block (row r's piece k at
   group[k] + len[k] * r from the block's head for the scale, from its vectors for a word: hk_r16_head,
   hk_r16_body), its length, and how many pieces a block has: the layouts' one statement of where bytes go.
   Q4_K's pieces are the block's 36 32-bit words (no head: its vectors are the whole block); the other types'
   are the float16 scale (k = 0: the block's first two bytes, Q6_K's last two), then their other bytes' 32-bit
   words. */
#define MAX_PIECES 53 /* Q6_K's */

/* The vector of Q6_K's 16-row block that holds word j of its rows' first 208 bytes, in the order its kernels read
   them (see hk.h): the scales (words 48-51), then per quarter c = 2h + e the words of ql at 64h + 16e, of ql at
   64h + 32 + 16e, and of qh at 128 + 32h + 16e, four each. */
static int q6_k_vector(int j) {
    if (j >= 48) return j - 48;
    if (j >= 32) return 4 + 12 * ((j - 32) / 4) + 8 + j % 4; /* qh: quarter (j - 32) / 4 */
    return 4 + 12 * (2 * (j / 16) + j % 8 / 4) + 4 * (j % 16 / 8) + j % 4; /* ql */
}
typedef struct {
    int ts, np, headed, file[MAX_PIECES], group[MAX_PIECES], len[MAX_PIECES];
} layout;

static void layout_of(int type, layout *l) {
    const int base = hk_r16_base(type), words_only = base == HK_Q4_K, scale_last = base == HK_Q6_K;
    l->ts = hk_type_info(base)->type_size;
    l->np = words_only ? l->ts / 4 : (l->ts - 2) / 4 + 1;
    l->headed = !words_only;
    for (int k = 0; k < l->np; k++) {
        const int word = words_only ? k : k - 1; /* -1: the scale */
        l->len[k] = word < 0 ? 2 : 4;
        l->file[k] = word < 0 ? (scale_last ? l->ts - 2 : 0) : 4 * word + (words_only || scale_last ? 0 : 2);
        l->group[k] = word < 0 ? 0 : 64 * (scale_last ? q6_k_vector(word) : word);
    }
}

/* Blocks b0 .. b0 + n - 1 (of a row's nb) of rows r0 .. r0 + nr - 1 between the layouts: from the file layout
   (rows stride bytes apart) into the group at g when to_group, else back (into row, n blocks of one row,
   nr = 1). */
static void move_pieces(int type, int to_group, uint8_t *g, uint8_t *row, ptrdiff_t stride, int r0, int nr, int b0, int n, int nb) {
    layout l;
    layout_of(type, &l);
    const size_t bytes = 16 * (size_t)l.ts;
    for (int b = 0; b < n; b++) {
        uint8_t *const body = g + (l.headed ? hk_r16_body(bytes, b0 + b, nb) : bytes * (b0 + b));
        uint8_t *const head = l.headed ? g + hk_r16_head(bytes, b0 + b) : body; /* Q4_K: no head */
        for (int r = r0; r < r0 + nr; r++) {
            uint8_t *f = row + (ptrdiff_t)(r - r0) * stride + (ptrdiff_t)b * l.ts;
            for (int k = 0; k < l.np; k++) {
                uint8_t *q = k == 0 ? head : body;
                if (to_group)
                    memcpy(q + l.group[k] + l.len[k] * r, f + l.file[k], l.len[k]);
                else
                    memcpy(f + l.file[k], q + l.group[k] + l.len[k] * r, l.len[k]);
            }
        }
    }
}

typedef struct {
    int type;
    const uint8_t *src;
    ptrdiff_t stride;
    int nb;
    uint8_t *dst;
} repack_job;

/* One group of 16 rows (a pool task). */
static void repack_group(void *ctx, int task) {
    const repack_job *j = ctx;
    const int ts = hk_type_info(j->type)->type_size;
    move_pieces(j->type, 1, j->dst + (ptrdiff_t)16 * task * j->nb * ts, (uint8_t *)(j->src + (ptrdiff_t)16 * task * j->stride),
                j->stride, 0, 16, 0, j->nb, j->nb);
}

void hk_repack16(int type, const uint8_t *src, ptrdiff_t stride, int rows, int nb, uint8_t *dst) {
    repack_job j = {type, src, stride, nb, dst};
    hk_pool_run(repack_group, &j, rows / 16);
}

#define CHUNK_BLOCKS 128 /* a row is put back together this many blocks at a time, on the stack */
#define CHUNK_BYTES (CHUNK_BLOCKS * 210) /* the largest block: Q6_K's */

int hk_matrix_row(int type, const uint8_t *w, ptrdiff_t stride, ptrdiff_t id, int cols, float *out) {
    if (!hk_is_r16(type)) return hk_dequantize_row(type, w + id * stride, cols, out);
    const uint8_t *group = w + (id - id % 16) * stride;
    const int base = hk_r16_base(type), qk = hk_type_info(base)->block, nb = cols / qk;
    uint8_t row[CHUNK_BYTES];
    for (int b0 = 0; b0 < nb; b0 += CHUNK_BLOCKS) {
        const int n = nb - b0 < CHUNK_BLOCKS ? nb - b0 : CHUNK_BLOCKS;
        move_pieces(type, 0, (uint8_t *)group, row, 0, (int)(id % 16), 1, b0, n, nb);
        if (hk_dequantize_row(base, row, n * qk, out + (size_t)b0 * qk) != 0) return -1;
    }
    return 0;
}

/* Row r of a repacked group back in the file layout, a chunk at a time, through the type's scalar dot. A
   fallback only (a matrix repacked for AVX-512, then the ISA switched): its sums are not the 16-row kernel's
   bits. */
static void scalar_rows16_r16(const int type, int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os) {
    const int base = hk_r16_base(type), qk = hk_type_info(base)->block;
    const hk_dot_fn dot = hk_isa_scalar.dot[base];
    uint8_t row[CHUNK_BYTES];
    (void)stride;
    for (int r = 0; r < 16; r++) {
        float sum[HK_MAX_NT] = {0};
        for (int b0 = 0; b0 < nb; b0 += CHUNK_BLOCKS) {
            const int n = nb - b0 < CHUNK_BLOCKS ? nb - b0 : CHUNK_BLOCKS;
            move_pieces(type, 0, (uint8_t *)w, row, 0, r, 1, b0, n, nb);
            hk_act part[HK_MAX_NT];
            for (int t = 0; t < nt; t++) /* the activations of these blocks */
                part[t] = (hk_act){.qs = a[t].qs + b0 * qk, .d = a[t].d + b0, .ds = a[t].ds ? a[t].ds + b0 : NULL,
                                   .bsums = a[t].bsums ? a[t].bsums + b0 * (qk / 16) : NULL};
            float got[HK_MAX_NT];
            dot(n, row, part, nt, got, 1);
            for (int t = 0; t < nt; t++) sum[t] += got[t];
        }
        for (int t = 0; t < nt; t++) out[t * os + r] = sum[t];
    }
}

/* The portable 16-row kernel of each 16-row type (hk.h). */
#define SCALAR_ROWS16(name, type) HK_ROWS16_FOR_TYPE(hk_scalar_rows16_##name, scalar_rows16_r16, type)

SCALAR_ROWS16(q4_0_r16, HK_Q4_0_R16)
SCALAR_ROWS16(iq4_nl_r16, HK_IQ4_NL_R16)
SCALAR_ROWS16(q4_k_r16, HK_Q4_K_R16)
SCALAR_ROWS16(q8_0_r16, HK_Q8_0_R16)
SCALAR_ROWS16(q6_k_r16, HK_Q6_K_R16)
