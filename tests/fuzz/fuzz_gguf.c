/* fuzz_gguf.c - libFuzzer target for the GGUF parser (csrc/ork/gguf.c) and the
 * block dequantizers (csrc/ork/dequant.c).
 *
 * For every input: ork_gguf_parse; on success, every metadata key and value is
 * walked with ork_gguf_visit_value (the callbacks read every byte they are
 * handed, so ASan sees any span that reaches past the input), every tensor
 * name is read, the parser's documented invariants are checked (a violation
 * is a bug: __builtin_trap), and every tensor of a supported type with at most
 * FUZZ_MAX_DEQUANT elements is dequantized into a malloc'd buffer.
 *
 * libFuzzer hands the input in a heap block of exactly `size` bytes, so a
 * one-byte over-read is an ASan report. Built by tests/fuzz/build.sh; run by
 * tests/test_fuzz.py (short) or by hand (see build.sh).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dequant.h"
#include "ggml_types.h"
#include "gguf.h"

#define FUZZ_MAX_DEQUANT ((uint64_t)1 << 16)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

/* The sums land here so the reads cannot be optimised away. */
static volatile uint64_t g_sink;

typedef struct {
    uint64_t sum;
    int depth; /* array_begin minus array_end, must never go negative */
} visit_ctx;

static uint64_t sum_bytes(const uint8_t *p, uint64_t n) {
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i++) s += p[i];
    return s;
}

static int on_scalar(void *ctx, uint32_t type, const uint8_t *p) {
    visit_ctx *c = (visit_ctx *)ctx;
    size_t sz = ork_gguf_scalar_size(type);
    CHECK(sz != 0);
    if (type == ORK_GGUF_BOOL) CHECK(p[0] <= 1);
    c->sum += sum_bytes(p, sz);
    return 0;
}

static int on_string(void *ctx, const uint8_t *p, uint64_t len) {
    visit_ctx *c = (visit_ctx *)ctx;
    CHECK(p != NULL || len == 0);
    c->sum += len + sum_bytes(p, len);
    return 0;
}

static int on_numeric_array(void *ctx, uint32_t elem_type, const uint8_t *p, uint64_t count) {
    visit_ctx *c = (visit_ctx *)ctx;
    size_t esz = ork_gguf_scalar_size(elem_type);
    CHECK(esz != 0);
    CHECK(count <= UINT64_MAX / esz);
    if (elem_type == ORK_GGUF_BOOL)
        for (uint64_t i = 0; i < count; i++) CHECK(p[i] <= 1);
    c->sum += count + sum_bytes(p, count * esz);
    return 0;
}

static int on_array_begin(void *ctx, uint32_t elem_type, uint64_t count) {
    visit_ctx *c = (visit_ctx *)ctx;
    CHECK(elem_type == ORK_GGUF_STRING || elem_type == ORK_GGUF_ARRAY);
    CHECK(c->depth < ORK_GGUF_MAX_DEPTH);
    c->depth++;
    c->sum += count;
    return 0;
}

static int on_array_end(void *ctx) {
    visit_ctx *c = (visit_ctx *)ctx;
    CHECK(c->depth > 0);
    c->depth--;
    return 0;
}

static void check_failure(ork_status st, const ork_gguf *g, const ork_err *err) {
    /* contract: a failed parse leaves *g empty and names the problem */
    CHECK(st == ORK_EGGUF || st == ORK_ENOMEM);
    CHECK(g->kv == NULL && g->tensors == NULL && g->n_kv == 0 && g->n_tensors == 0);
    CHECK(memchr(err->msg, '\0', sizeof err->msg) != NULL);
    CHECK(err->msg[0] != '\0');
    if (st == ORK_EGGUF) CHECK(strstr(err->msg, "byte offset") != NULL);
}

static void visit_metadata(const uint8_t *data, size_t size, const ork_gguf *g) {
    const ork_gguf_visitor v0 = {NULL, on_scalar, on_string, on_numeric_array, on_array_begin, on_array_end};
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const ork_gguf_kv *kv = &g->kv[i];
        CHECK(kv->key_len >= 1);
        CHECK(kv->key_off <= size && kv->key_len <= size - kv->key_off);
        CHECK(kv->value_off <= size);
        CHECK(kv->type < ORK_GGUF_TYPE_COUNT);
        visit_ctx c = {0, 0};
        c.sum = sum_bytes(data + kv->key_off, kv->key_len);
        ork_gguf_visitor v = v0;
        v.ctx = &c;
        ork_err err;
        err.msg[0] = '\0';
        /* the parser already validated this value: visiting it must succeed */
        ork_status st = ork_gguf_visit_value(data, size, kv->type, kv->value_off, &v, &err);
        CHECK(st == ORK_OK);
        CHECK(c.depth == 0);
        g_sink += c.sum;
    }
}

static void check_and_dequant_tensors(const uint8_t *data, size_t size, const ork_gguf *g) {
    CHECK(g->alignment >= 1 && (g->alignment & (g->alignment - 1)) == 0);
    if (g->n_tensors > 0) CHECK(g->data_off <= size && g->data_off % g->alignment == 0);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const ork_gguf_tensor *t = &g->tensors[i];
        CHECK(t->name_len >= 1 && t->name_len < ORK_GGUF_MAX_NAME);
        CHECK(t->name_off <= size && t->name_len <= size - t->name_off);
        g_sink += sum_bytes(data + t->name_off, t->name_len);
        CHECK(t->n_dims >= 1 && t->n_dims <= 4);
        uint64_t nel = 1;
        for (int d = 0; d < 4; d++) {
            CHECK(t->ne[d] >= 1);
            if ((uint32_t)d >= t->n_dims) CHECK(t->ne[d] == 1);
            CHECK(nel <= UINT64_MAX / t->ne[d]);
            nel *= t->ne[d];
        }
        CHECK(nel == t->n_elements);
        const ork_ggml_type_info *ti = ork_ggml_type(t->type);
        CHECK(ti != NULL);
        CHECK(t->ne[0] % ti->block_size == 0);
        CHECK(t->nbytes == t->n_elements / ti->block_size * ti->type_size);
        CHECK(t->offset % g->alignment == 0);
        CHECK(t->data_off == g->data_off + t->offset);
        CHECK(t->data_off <= size && t->nbytes <= size - t->data_off);

        if (!ork_dequant_supported(t->type) || t->n_elements > FUZZ_MAX_DEQUANT) continue;
        size_t n = (size_t)t->n_elements;
        float *dst = (float *)malloc(n * sizeof *dst);
        if (!dst) continue;
        ork_err err;
        err.msg[0] = '\0';
        ork_status st = ork_dequant_row(t->type, data + t->data_off, n, dst, &err);
        CHECK(st == ORK_OK);
        /* read the output back (MSan-style use; also keeps the call alive) */
        uint64_t s = 0;
        for (size_t k = 0; k < n; k++) {
            uint32_t u;
            memcpy(&u, &dst[k], sizeof u);
            s += u;
        }
        g_sink += s;
        free(dst);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ork_gguf g;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_gguf_parse(data, size, &g, &err);
    if (st != ORK_OK) {
        check_failure(st, &g, &err);
        return 0;
    }
    CHECK(g.version == 2 || g.version == 3);
    CHECK(g.size == size);
    CHECK(g.kv != NULL && g.tensors != NULL);
    visit_metadata(data, size, &g);
    check_and_dequant_tensors(data, size, &g);
    ork_gguf_free(&g);
    CHECK(g.kv == NULL && g.tensors == NULL);
    return 0;
}
