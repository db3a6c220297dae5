/* Shared declarations of Hearth's CPU kernels: GGUF type table, activation layout, per-ISA kernel tables. */
#ifndef HK_H
#define HK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* GGML type ids, as stored in GGUF files. */
enum {
    HK_F32 = 0, HK_F16 = 1, HK_Q4_0 = 2, HK_Q4_1 = 3, HK_Q5_0 = 6, HK_Q5_1 = 7, HK_Q8_0 = 8,
    HK_Q2_K = 10, HK_Q3_K = 11, HK_Q4_K = 12, HK_Q5_K = 13, HK_Q6_K = 14, HK_IQ2_XXS = 16, HK_IQ2_XS = 17,
    HK_IQ3_XXS = 18, HK_IQ4_NL = 20, HK_IQ3_S = 21, HK_IQ2_S = 22, HK_IQ4_XS = 23, HK_BF16 = 30,
    HK_TQ1_0 = 34, HK_TQ2_0 = 35, HK_MXFP4 = 39,
    /* Hearth's own, never in a file: Q4_0 / IQ4_NL / Q4_K / Q8_0 / Q6_K repacked at load into 16-row groups
       (hk_repack16) */
    HK_Q4_0_R16 = 40, HK_IQ4_NL_R16 = 41, HK_Q4_K_R16 = 42, HK_Q8_0_R16 = 43, HK_Q6_K_R16 = 44, HK_NTYPES = 45,
};

#define HK_QK 32    /* elements per block of the legacy types (and of Q8_32 activations) */
#define HK_QK_K 256 /* elements per super-block of the K, ternary and IQ types but IQ4_NL (and of Q8_K activations) */
#define HK_MAX_NT 8 /* most tokens per tile: each weight block is decoded once per tile */
#define HK_TILE 4   /* the usual tile: what 16 vector registers hold */

/* Before a loop over a tile's tokens: unrolled for the constant tile sizes, so each accumulator is a register
   (without it GCC kept some tiles' accumulators on the stack). */
#if defined(__GNUC__) || defined(__clang__)
#define HK_UNROLL _Pragma("GCC unroll 8")
#else
#define HK_UNROLL
#endif

/* How a weight type wants its activations. */
typedef enum { HK_ACT_F32, HK_ACT_Q8_32, HK_ACT_Q8_K } hk_act_kind;

typedef struct {
    int id;
    const char *name;
    int block;     /* elements per block */
    int type_size; /* bytes per block */
    hk_act_kind act;
} hk_type;

/* The one table of supported types; NULL for an unsupported id. */
const hk_type *hk_type_info(int id);

/* One token's activations in the form its weight type consumes. Unused fields are NULL. */
typedef struct {
    const float *f;       /* HK_ACT_F32: (cols,) the raw activations */
    const int8_t *qs;     /* (cols,) quantized values */
    const float *d;       /* (cols/32,) or (cols/256,) scale of each block */
    const float *ds;      /* HK_ACT_Q8_32: (cols/32,) d * sum(qs) of each block */
    const int16_t *bsums; /* HK_ACT_Q8_K: (cols/16,) sum of qs over each 16 */
} hk_act;

/* Dot products of one weight row (nb blocks at w) with nt <= HK_MAX_NT tokens: out[t * os] = w . a[t]. */
typedef void (*hk_dot_fn)(int nb, const uint8_t *w, const hk_act *a, int nt, float *out, ptrdiff_t os);
/* The same for 16 rows, stride bytes apart: out[t * os + r] = row r . a[t], r = 0..15. */
typedef void (*hk_dot16_fn)(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os);
/* A product of 16 rows (stride bytes apart) with any number n of tokens: out[t * os + r] = row r . a[t], each
   block of the rows decoded once for all n tokens. Each result is the same bits as the type's dot16 kernel
   gives, or its dot kernel where it has no dot16 (the same exact integer sums, then the same float steps), so
   the choice between them, and the batch size, is invisible. */
typedef void (*hk_gemm16_fn)(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, float *out, ptrdiff_t os);
/* A 16-row kernel (the shape of hk_dot16_fn and hk_gemm16_fn) called name: impl, which takes the type as its first
   argument, for one type. */
#define HK_ROWS16_FOR_TYPE(name, impl, type)                                                                 \
    void name(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int n, float *out, ptrdiff_t os) { \
        impl(type, nb, w, stride, a, n, out, os);                                                            \
    }
/* Quantize one token of cols floats (cols a multiple of the block) into the given arrays. */
typedef void (*hk_quant32_fn)(const float *x, int cols, int8_t *qs, float *d, float *ds);
typedef void (*hk_quantK_fn)(const float *x, int cols, int8_t *qs, float *d, int16_t *bsums);

typedef struct {
    const char *name;
    hk_dot_fn dot[HK_NTYPES]; /* NULL: use the scalar kernel */
    hk_dot16_fn dot16[HK_NTYPES]; /* 16 rows at a time where a kernel exists (NULL: dot, row by row) */
    hk_gemm16_fn gemm16[HK_NTYPES]; /* 16 rows against all the tokens of a tile (NULL: dot16 or dot) */
    int tile[HK_NTYPES];      /* tokens per tile, at most HK_MAX_NT (0: HK_TILE); more where it measured faster */
    hk_quant32_fn quant32;    /* NULL: use the scalar one */
    hk_quantK_fn quantK;
} hk_isa;

extern const hk_isa hk_isa_scalar;
#if defined(__x86_64__) || defined(_M_X64)
#define HK_X86 1
extern const hk_isa hk_isa_avx2;
extern const hk_isa hk_isa_avxvnni;
extern const hk_isa hk_isa_avx512;
#endif
#if defined(__aarch64__)
extern const hk_isa hk_isa_neon;
extern const hk_isa hk_isa_dotprod;
#endif

/* Scalar helpers shared by every translation unit. */
float hk_f16_to_f32(uint16_t h);
static inline uint16_t hk_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t hk_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline float hk_bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

/* Unpack the 6-bit scales and mins of a Q4_K / Q5_K super-block (12 bytes) into sc[8] and mn[8], four at
   a time in 32-bit words: bytes 0-3 hold scales 0-3 (+ top bits of 4-7), 4-7 mins 0-3 (+ top bits of
   mins 4-7), 8-11 the low nibbles of scales 4-7 and, above them, of mins 4-7. */
static inline void hk_unpack_k4_scales(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    uint32_t a0 = hk_u32(s), a1 = hk_u32(s + 4), a2 = hk_u32(s + 8);
    uint32_t w[4] = {a0 & 0x3F3F3F3Fu, (a2 & 0x0F0F0F0Fu) | ((a0 >> 2) & 0x30303030u),
                     a1 & 0x3F3F3F3Fu, ((a2 >> 4) & 0x0F0F0F0Fu) | ((a1 >> 2) & 0x30303030u)};
    memcpy(sc, w, 8);
    memcpy(mn, w + 2, 8);
}

/* Unpack the 16 signed 6-bit scales of a Q3_K super-block (12 bytes) into sc[16], already minus 32:
   low nibbles in bytes 0-7 (scales 0-7, then 8-15 in the high nibbles), top two bits in bytes 8-11. */
static inline void hk_unpack_q3k_scales(const uint8_t *s, int8_t *sc) {
    uint32_t a0 = hk_u32(s), a1 = hk_u32(s + 4), a2 = hk_u32(s + 8), w[4];
    w[0] = (a0 & 0x0F0F0F0Fu) | ((a2 & 0x03030303u) << 4);
    w[1] = (a1 & 0x0F0F0F0Fu) | (((a2 >> 2) & 0x03030303u) << 4);
    w[2] = ((a0 >> 4) & 0x0F0F0F0Fu) | (((a2 >> 4) & 0x03030303u) << 4);
    w[3] = ((a1 >> 4) & 0x0F0F0F0Fu) | (((a2 >> 6) & 0x03030303u) << 4);
    for (int k = 0; k < 4; k++) /* bytewise minus 32: the set top bits stop a borrow crossing bytes */
        w[k] = ((w[k] | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
    memcpy(sc, w, 16);
}

/* The 16 values of a 4-bit IQ4_NL / IQ4_XS code, and of an MXFP4 (e2m1) code doubled to integers; MXFP4's
   scale is halved to match (hk_e8m0_half). */
static const int8_t hk_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t hk_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* Half the power of two an MXFP4 block's e8m0 scale byte stands for: 2^(e - 128), subnormal below e = 2. */
static inline float hk_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* IQ2 / IQ3 grids (entry = its element values, one byte each, first in the lowest byte) and sign tables
   (kernels_iq_tables.c, generated from the gguf package). */
extern const uint64_t hk_iq2xxs_grid[256], hk_iq2xs_grid[512], hk_iq2s_grid[1024];
extern const uint32_t hk_iq3xxs_grid[256], hk_iq3s_grid[512];
extern const uint8_t hk_ksigns[128];     /* 7 stored sign bits -> 8 (bit j set: element j negative) */
extern const uint64_t hk_ksigns64[128];  /* the same as 8 int8 factors +1 / -1 */

/* The ternary TQ1_0 trit of byte q at power-of-three position (q * pow3 mod 256, then the top of * 3). */
static inline int hk_trit(uint8_t q, uint8_t pow3) { return ((uint16_t)(uint8_t)(q * pow3) * 3) >> 8; }

/* The 16-row layouts of Q4_0, IQ4_NL, Q4_K, Q8_0 and Q6_K (HK_Q4_0_R16, HK_IQ4_NL_R16, HK_Q4_K_R16,
   HK_Q8_0_R16, HK_Q6_K_R16).
   Rows stay in groups of 16 at the same offsets (group g at 16 * g * stride), so a group's pointer arithmetic
   is the file layout's; inside a group, block b holds the 16 rows' block b at 16 * type_size * b, its bytes
   already in vector lanes:
   - Q4_0 / IQ4_NL (16 * 18 bytes): the 16 rows' float16 scales (row r at 2r), then four 64-byte vectors,
     vector k holding bytes 4k..4k+3 of each row's 16 code bytes (row r at 4r);
   - Q8_0 (16 * 34 bytes): the same, with eight vectors of each row's 32 code bytes (signed, as in the file);
   - Q4_K (16 * 144 bytes): 36 64-byte vectors, vector k holding bytes 4k..4k+3 of each row's super-block (row
     r at 4r): d and dmin, the 12 scale bytes, then the 128 code bytes;
   - Q6_K (16 * 210 bytes): the 16 rows' float16 d (row r at 2r), then 52 vectors of one 32-bit word of each
     row's first 208 bytes (row r at 4r), in the order the kernels read them, so a block is read front to
     back: the 16 scales' four words, then for each quarter c = 2h + e (h, e = 0, 1) the four words of ql at
     64h + 16e, the four of ql at 64h + 32 + 16e and the four of qh at 128 + 32h + 16e.
   A 16-row kernel loads a block's codes and scales as they are, where the file layout needs them transposed.
   The layouts with a 32-byte head of scales (all but Q4_K) keep their vectors on 64-byte lines: blocks go in
   pairs, the two heads first and then the two blocks' vectors (hk_r16_head, hk_r16_body); a row's last block,
   when nb is odd, is head then vectors. Against head-then-vectors for every block (half the blocks' vectors split
   across two lines), one thread's Q6_K products of Llama-3.1-8B from memory ran 1.056x; Q4_0's and Q8_0's
   were unchanged from memory and faster in cache (docs/benchmarks.md). */
/* Bytes ahead of the block being read that a 16-row layout's one-token kernel prefetches its own stream into
   L1, or 0 for none; into L2 it prefetches HK_STREAM_L2_TIMES as far (matmul.c sets it from the CPU's vendor;
   stream_ahead in kernels_avx512_rows16.inc). */
extern int hk_stream_ahead;
#define HK_STREAM_L2_TIMES 4
static inline int hk_is_r16(int type) { return type >= HK_Q4_0_R16 && type <= HK_Q6_K_R16; }
/* Where block b (of a row's nb) of a 16-row group lies in a layout with a 32-byte head: its head and its
   vectors, from the group's start; bytes = 16 * type_size, 32 more than a multiple of 64. */
static inline size_t hk_r16_head(size_t bytes, int b) { return bytes * (size_t)(b & ~1) + 32 * (size_t)(b & 1); }
static inline size_t hk_r16_body(size_t bytes, int b, int nb) {
    return bytes * (size_t)(b & ~1) + ((b | 1) < nb ? 64 + (size_t)(b & 1) * (bytes - 32) : 32);
}
static inline int hk_r16_base(int type) {
    return type == HK_Q4_0_R16 ? HK_Q4_0 : type == HK_IQ4_NL_R16 ? HK_IQ4_NL : type == HK_Q4_K_R16 ? HK_Q4_K
         : type == HK_Q8_0_R16 ? HK_Q8_0 : type == HK_Q6_K_R16 ? HK_Q6_K : type;
}
/* The 16-row type of a file type (HK_Q4_0 -> HK_Q4_0_R16), or -1 for a type without one. */
static inline int hk_r16_of(int type) {
    return type == HK_Q4_0 ? HK_Q4_0_R16 : type == HK_IQ4_NL ? HK_IQ4_NL_R16 : type == HK_Q4_K ? HK_Q4_K_R16
         : type == HK_Q8_0 ? HK_Q8_0_R16 : type == HK_Q6_K ? HK_Q6_K_R16 : -1;
}
/* dst (the same size as src) = rows (a multiple of 16) of nb blocks of type (a file type with a 16-row type),
   stride bytes apart, in the 16-row layout; dst's rows are nb * type_size bytes apart. On the thread pool:
   callers hold the compute lock. */
void hk_repack16(int type, const uint8_t *src, ptrdiff_t stride, int rows, int nb, uint8_t *dst);
/* Dequantize row id of a matrix (rows stride bytes apart) of cols elements, in the file layout or a 16-row one
   (whose row is spread over its group); returns 0, or -1 for an unsupported type. */
int hk_matrix_row(int type, const uint8_t *w, ptrdiff_t stride, ptrdiff_t id, int cols, float *out);
/* Portable 16-row kernels of the 16-row types: where a matrix was repacked under one ISA and another runs. */
void hk_scalar_rows16_q4_0_r16(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os);
void hk_scalar_rows16_iq4_nl_r16(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os);
void hk_scalar_rows16_q4_k_r16(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os);
void hk_scalar_rows16_q8_0_r16(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os);
void hk_scalar_rows16_q6_k_r16(int nb, const uint8_t *w, ptrdiff_t stride, const hk_act *a, int nt, float *out, ptrdiff_t os);

/* Scalar kernels and dequantization (kernels_scalar.c). */
void hk_scalar_quant32(const float *x, int cols, int8_t *qs, float *d, float *ds);
void hk_scalar_quantK(const float *x, int cols, int8_t *qs, float *d, int16_t *bsums);
/* Dequantize one row of cols elements; returns 0, or -1 for an unsupported type. */
int hk_dequantize_row(int type, const uint8_t *w, int cols, float *out);

#endif
