/* The matrix product driver: ISA selection, activation quantization into a reused scratch buffer, and
   the row-chunk x token-tile split over the thread pool. */
#include "matmul.h"

#include <stdlib.h>

#include "kernels_iq_gemm.h"
#include "pool.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

/* -- CPU features and ISA selection */

void hk_cpu_features(hk_features *f) {
    memset(f, 0, sizeof *f);
#if defined(HK_X86) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    f->avx2 = __builtin_cpu_supports("avx2") != 0;
    f->fma = __builtin_cpu_supports("fma") != 0;
    f->f16c = __builtin_cpu_supports("f16c") != 0;
    f->bmi2 = __builtin_cpu_supports("bmi2") != 0;
    f->avx512f = __builtin_cpu_supports("avx512f") != 0;
    f->avx512bw = __builtin_cpu_supports("avx512bw") != 0;
    f->avx512vl = __builtin_cpu_supports("avx512vl") != 0;
    f->avx512vnni = __builtin_cpu_supports("avx512vnni") != 0;
    f->avx512bf16 = __builtin_cpu_supports("avx512bf16") != 0;
    f->avxvnni = __builtin_cpu_supports("avxvnni") != 0;
#elif defined(__aarch64__)
    f->neon = 1;
#if defined(__linux__) && defined(HWCAP_ASIMDDP)
    f->dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
    int v = 0;
    size_t size = sizeof v;
    f->dotprod = sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &size, NULL, 0) == 0 && v != 0;
#elif defined(__ARM_FEATURE_DOTPROD)
    f->dotprod = 1;
#endif
#endif
}

typedef struct {
    const char *name;
    const hk_isa *isa;
} isa_choice;

/* The ISAs this CPU can run, best last. */
static int usable_isas(isa_choice *out) {
    int n = 0;
    out[n++] = (isa_choice){"scalar", &hk_isa_scalar};
#ifdef HK_X86
    hk_features f;
    hk_cpu_features(&f);
    int avx2 = f.avx2 && f.fma && f.f16c;
    if (avx2) out[n++] = (isa_choice){"avx2", &hk_isa_avx2};
    if (avx2 && f.avxvnni) out[n++] = (isa_choice){"avxvnni", &hk_isa_avxvnni};
    if (avx2 && f.bmi2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni) /* bmi2: the IQ2_S row kernel */
        out[n++] = (isa_choice){"avx512", &hk_isa_avx512};
#elif defined(__aarch64__)
    hk_features f;
    hk_cpu_features(&f);
    out[n++] = (isa_choice){"neon", &hk_isa_neon};
    if (f.dotprod) out[n++] = (isa_choice){"dotprod", &hk_isa_dotprod};
#endif
    return n;
}

static const hk_isa *ACTIVE = &hk_isa_scalar;

int hk_stream_ahead = 0;

/* Intel cores get a 16-row layout's stream prefetched a page ahead (hk.h; measured on an Emerald Rapids Xeon,
   where 2, 4 and 8 KiB ahead read alike); others, Zen measured, leave it to the hardware prefetcher. */
int hk_default_stream_ahead(void) {
#if defined(HK_X86) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") ? 4096 : 0;
#else
    return 0;
#endif
}

int hk_select_isa(const char *name) {
    isa_choice c[8];
    int n = usable_isas(c);
    if (name == NULL || strcmp(name, "auto") == 0 || name[0] == '\0') {
        ACTIVE = c[n - 1].isa;
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (strcmp(c[i].name, name) == 0) {
            ACTIVE = c[i].isa;
            return 0;
        }
    return -1;
}

const char *hk_isa_name(void) { return ACTIVE->name; }

const char *hk_usable_isa_names(void) {
    static char buf[128];
    isa_choice c[8];
    int n = usable_isas(c);
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (i) strcat(buf, ", ");
        strcat(buf, c[i].name);
    }
    return buf;
}

/* -- scratch: quantized activations of every token, grown on demand and never shrunk */

static void *SCRATCH;
static size_t SCRATCH_SIZE;

static void *scratch(size_t need) {
    if (need <= SCRATCH_SIZE) return SCRATCH;
    void *p = NULL;
    if (posix_memalign(&p, 64, need) != 0) return NULL;
    free(SCRATCH);
    SCRATCH = p;
    SCRATCH_SIZE = need;
    return p;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t hk_act_bytes(int kind, int cols) {
    if (kind == HK_ACT_Q8_32) return align64(cols) + 2 * align64(sizeof(float) * (cols / HK_QK));
    if (kind == HK_ACT_Q8_K) return align64(cols) + align64(sizeof(float) * (cols / HK_QK_K)) + align64(2 * (cols / 16));
    return 0;
}

void hk_quantize_act(const hk_isa *isa, hk_act_kind kind, const float *x, int cols, uint8_t *mem, hk_act *a) {
    memset(a, 0, sizeof *a);
    a->f = x;
    if (kind == HK_ACT_F32) return;
    int8_t *qs = (int8_t *)mem;
    float *d = (float *)(void *)(mem + align64(cols));
    if (kind == HK_ACT_Q8_32) {
        float *ds = (float *)(void *)((uint8_t *)d + align64(sizeof(float) * (cols / HK_QK)));
        (isa->quant32 ? isa->quant32 : hk_scalar_quant32)(x, cols, qs, d, ds);
        a->ds = ds;
    } else {
        int16_t *bs = (int16_t *)(void *)((uint8_t *)d + align64(sizeof(float) * (cols / HK_QK_K)));
        (isa->quantK ? isa->quantK : hk_scalar_quantK)(x, cols, qs, d, bs);
        a->bsums = bs;
    }
    a->qs = qs;
    a->d = d;
}

/* -- the product */

/* -- the row loop every product runs */

static hk_dot_fn dot_of(const hk_isa *isa, int type) {
    hk_dot_fn iq = hk_iq_dot(isa, type);
    return iq ? iq : isa->dot[type] ? isa->dot[type] : hk_isa_scalar.dot[type];
}

int hk_repack_type(int type) {
    const int r16 = hk_r16_of(type);
    return r16 >= 0 && ACTIVE->dot16[r16] ? r16 : -1;
}

/* The 16-row kernel of a type under isa, if it has one; a repacked type always has one (the scalar fallback). */
static hk_dot16_fn dot16_of(const hk_isa *isa, int type) {
    if (isa->dot16[type]) return isa->dot16[type];
    return type == HK_Q4_0_R16 ? hk_scalar_rows16_q4_0_r16 : type == HK_IQ4_NL_R16 ? hk_scalar_rows16_iq4_nl_r16
         : type == HK_Q4_K_R16 ? hk_scalar_rows16_q4_k_r16 : type == HK_Q8_0_R16 ? hk_scalar_rows16_q8_0_r16
         : type == HK_Q6_K_R16 ? hk_scalar_rows16_q6_k_r16 : NULL;
}

static int tile_of(const hk_isa *isa, int type) {
    return (isa->dot[type] || isa->dot16[type]) && isa->tile[type] ? isa->tile[type] : HK_TILE;
}

#define GEMM_TILE 64 /* tokens per call of a 16-row GEMM kernel: their activations stay in L2 across the rows */
#define GEMM_MIN 4   /* fewer tokens run dot16 or dot: transposing a K-quant super-block pays across several tokens */

/* Rows [r, r1) one by one, nt tokens a tile at a time. */
static void dot_each_row(const hk_isa *isa, int type, int nb, const uint8_t *w, ptrdiff_t stride, int r, int r1,
                         const hk_act *acts, int nt, float *o, int rows) {
    const hk_dot_fn dot = dot_of(isa, type);
    const int tile = tile_of(isa, type);
    for (int t0 = 0; t0 < nt; t0 += tile)
        for (int i = r; i < r1; i++)
            dot(nb, w + (ptrdiff_t)i * stride, acts + t0, nt - t0 < tile ? nt - t0 : tile, o + (size_t)t0 * rows + i, rows);
}

void hk_dot_rows(const hk_isa *isa, int type, const uint8_t *w, ptrdiff_t stride, int r0, int r1, int cols,
                 const hk_act *acts, int n, float *out, int rows) {
    const hk_type *ti = hk_type_info(type);
    const hk_dot16_fn dot16 = dot16_of(isa, type);
    const hk_rows_fn iq_rows = hk_iq_rows(isa, type, n);
    if (iq_rows && iq_rows(type, w, stride, r0, r1, cols, acts, n, out, rows) == 0) return;
    /* the same bits as dot, or as dot16 where there is one (see hk.h): which runs is a matter of speed only;
       a 16-row kernel does a single tile of tokens as fast */
    const hk_gemm16_fn gemm16 = n >= GEMM_MIN && (!dot16 || n > tile_of(isa, type)) ? isa->gemm16[type] : NULL;
    const int tile = gemm16 ? GEMM_TILE : tile_of(isa, type), nb = cols / ti->block;
    for (int t0 = 0; t0 < n; t0 += tile) {
        int nt = n - t0 < tile ? n - t0 : tile, r = r0;
        float *o = out + (size_t)t0 * rows;
        if (gemm16)
            for (; r + 16 <= r1; r += 16) gemm16(nb, w + (ptrdiff_t)r * stride, stride, acts + t0, nt, o + r, rows);
        else if (dot16)
            for (; r + 16 <= r1; r += 16) dot16(nb, w + (ptrdiff_t)r * stride, stride, acts + t0, nt, o + r, rows);
        dot_each_row(isa, type, nb, w, stride, r, r1, acts + t0, nt, o, rows);
    }
}

#define TASK_MIN_BYTES 16384   /* a task with less weight than this costs more to hand out than it saves */
#define TILE_CHUNK_BYTES 24576 /* several tiles of tokens: a chunk of weights that stays in L1 across them */

int hk_chunk_rows(const hk_isa *isa, int type, int rows, int n, int cols) {
    const hk_type *ti = hk_type_info(type);
    size_t rb = (size_t)cols / ti->block * ti->type_size;
    int c;
    if (hk_iq_rows(isa, type, n)) return HK_IQ_GEMM_ROWS;
    if (rb == 0) rb = 1;
    if (n <= tile_of(isa, type)) {
        /* bandwidth-bound: HK_UNITS_PER_THREAD units per thread, none too small. Against eight units per
           thread, two made a decode of Llama-3.2-1B Q4_0 (2 threads, per-phase times, paired in one process)
           6 % faster while the host's read pass gave 54 GB/s or more and 4 % in slower stretches, its q/k/v
           phase 21 % faster; one unit per thread gained less (4 % in fast stretches). */
        int min_rows = (int)((TASK_MIN_BYTES + rb - 1) / rb);
        c = rows / (hk_pool_threads() * HK_UNITS_PER_THREAD);
        c = c > min_rows ? c : min_rows;
    } else {
        size_t l1 = TILE_CHUNK_BYTES / rb;
        c = (int)(l1 < 4 ? 4 : l1 > 64 ? 64 : l1);
    }
    return dot16_of(isa, type) || isa->gemm16[type] ? (c + 15) / 16 * 16 : c;
}

/* -- the product */

typedef struct {
    const hk_isa *isa;
    int type;
    hk_act_kind kind;
    const uint8_t *w;
    ptrdiff_t w_stride;
    int rows, cols, n, chunk;
    const float *x;
    uint8_t *act_mem;
    size_t act_size;
    hk_act *acts;
    float *out;
} mm_job;

static void quantize_task(void *ctx, int t) {
    mm_job *j = ctx;
    hk_quantize_act(j->isa, j->kind, j->x + (size_t)t * j->cols, j->cols, j->act_mem + (size_t)t * j->act_size, &j->acts[t]);
}

/* One chunk of rows against every token, a tile of tokens at a time; the chunk stays in L1/L2 across tiles. */
static void rows_task(void *ctx, int task) {
    mm_job *j = ctx;
    int r0 = task * j->chunk, r1 = r0 + j->chunk < j->rows ? r0 + j->chunk : j->rows;
    hk_dot_rows(j->isa, j->type, j->w, j->w_stride, r0, r1, j->cols, j->acts, j->n, j->out, j->rows);
}

int hk_matmul(int type, const uint8_t *w, ptrdiff_t w_stride, int rows, int cols, const float *x, int n, float *out) {
    const hk_type *ti = hk_type_info(type);
    mm_job j = {.isa = ACTIVE, .type = type, .kind = ti->act, .w = w, .w_stride = w_stride, .rows = rows, .cols = cols,
                .n = n, .x = x, .out = out};
    if (rows == 0 || n == 0) return 0;
    j.act_size = hk_act_bytes(j.kind, cols);
    size_t acts_bytes = align64(sizeof(hk_act) * (size_t)n);
    uint8_t *mem = scratch(acts_bytes + j.act_size * (size_t)n);
    if (!mem) return -1;
    j.acts = (hk_act *)mem;
    j.act_mem = mem + acts_bytes;
    if (n == 1 || j.kind == HK_ACT_F32)
        for (int t = 0; t < n; t++) quantize_task(&j, t);
    else
        hk_pool_run(quantize_task, &j, n);
    j.chunk = hk_chunk_rows(ACTIVE, type, rows, n, cols);
    hk_pool_run(rows_task, &j, (rows + j.chunk - 1) / j.chunk);
    return 0;
}
