/* The decoder's matrix products on the kernels' dot functions (see products.h). */
#include "products.h"

#include <string.h>

#include "matmul.h"
#include "pool.h"

static int imin(int a, int b) { return a < b ? a : b; }

/* matmul.c keeps its pointer private; the name says which table it is. */
const hk_isa *hk_active_isa(void) {
    const char *name = hk_isa_name();
#ifdef HK_X86
    const hk_isa *x86[] = {&hk_isa_avx2, &hk_isa_avxvnni, &hk_isa_avx512};
    for (int i = 0; i < 3; i++)
        if (strcmp(name, x86[i]->name) == 0) return x86[i];
#endif
#ifdef __aarch64__
    if (strcmp(name, hk_isa_neon.name) == 0) return &hk_isa_neon;
    if (strcmp(name, hk_isa_dotprod.name) == 0) return &hk_isa_dotprod;
#endif
    return &hk_isa_scalar;
}

unsigned hk_act_kinds(const hk_matrix *a, const hk_matrix *b, const hk_matrix *c) {
    unsigned mask = 0;
    const hk_matrix *ms[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (ms[i]) mask |= 1u << hk_type_info(ms[i]->type)->act;
    return mask;
}

void hk_prepare_acts(const hk_isa *isa, const hk_act_rows *rows, const float *x, int cols, unsigned kinds, int r) {
    for (int kind = 0; kind < HK_ACT_KINDS; kind++)
        if (kinds & (1u << kind))
            hk_quantize_act(isa, (hk_act_kind)kind, x, cols, rows->mem[kind] + (size_t)r * rows->stride[kind], &rows->acts[kind][r]);
}

static void part_init(hk_product_part *p, const hk_isa *isa, const hk_act_rows *rows, const hk_matrix *w, float *out, int n) {
    p->isa = isa;
    p->w = w;
    p->out = out;
    p->acts = rows->acts[hk_type_info(w->type)->act];
    p->chunk = hk_chunk_rows(isa, w->type, w->rows, n, w->cols);
    p->n_chunks = (w->rows + p->chunk - 1) / p->chunk;
}

void hk_product_init(hk_product *p, const hk_isa *isa, const hk_vecops *vo, const hk_act_rows *rows, int n,
                     const hk_matrix *const w[3], float *const out[3], int glu, int gelu) {
    memset(p, 0, sizeof *p);
    p->n = n;
    p->vo = vo;
    p->glu = glu;
    p->gelu = gelu;
    for (int i = 0; i < 3 && w[i]; i++, p->n_parts++) {
        part_init(&p->part[i], isa, rows, w[i], out[i], n);
        p->n_units += p->part[i].n_chunks;
    }
    if (glu) { /* gate and up share the row chunks, so a chunk's activation has both */
        p->part[1].chunk = p->part[0].chunk;
        p->n_units = p->part[0].n_chunks;
    }
}

static void part_rows(const hk_product_part *p, int r0, int r1, int n) {
    const hk_matrix *w = p->w;
    hk_dot_rows(p->isa, w->type, w->data, w->stride, r0, r1, w->cols, p->acts, n, p->out, w->rows);
}

void hk_product_unit(const hk_product *p, int unit) {
    if (p->glu) {
        const hk_product_part *gate = &p->part[0], *up = &p->part[1];
        int r0 = unit * gate->chunk, r1 = imin(gate->w->rows, r0 + gate->chunk);
        part_rows(gate, r0, r1, p->n);
        part_rows(up, r0, r1, p->n);
        for (int i = 0; i < p->n; i++)
            p->vo->glu(gate->out + (size_t)i * gate->w->rows + r0, up->out + (size_t)i * up->w->rows + r0, r1 - r0, p->gelu);
        return;
    }
    for (int i = 0; i < p->n_parts; i++) {
        const hk_product_part *part = &p->part[i];
        if (unit < part->n_chunks) {
            part_rows(part, unit * part->chunk, imin(part->w->rows, (unit + 1) * part->chunk), p->n);
            return;
        }
        unit -= part->n_chunks;
    }
}
