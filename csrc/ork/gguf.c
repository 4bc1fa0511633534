/* gguf.c - strict GGUF parser; see gguf.h for the contract. */
#include "gguf.h"

#include <stdlib.h>
#include <string.h>

#include "ggml_types.h"

typedef struct {
    const uint8_t *buf;
    uint64_t len, pos;
    ork_err *err;
} cursor;

#define FAIL(c, at, ...) gguf_fail((c)->err, (at), __VA_ARGS__)

static ork_status gguf_fail(ork_err *err, uint64_t at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#include <stdarg.h>
#include <stdio.h>
static ork_status gguf_fail(ork_err *err, uint64_t at, const char *fmt, ...) {
    if (err) {
        char tmp[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tmp, sizeof tmp, fmt, ap);
        va_end(ap);
        snprintf(err->msg, sizeof err->msg, "%s (at byte offset %llu)", tmp, (unsigned long long)at);
    }
    return ORK_EGGUF;
}

static const char *const value_type_names[ORK_GGUF_TYPE_COUNT] = {
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
    "BOOL",  "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"};

const char *ork_gguf_type_name(uint32_t type) {
    return type < ORK_GGUF_TYPE_COUNT ? value_type_names[type] : "?";
}

size_t ork_gguf_scalar_size(uint32_t type) {
    switch (type) {
    case ORK_GGUF_UINT8: case ORK_GGUF_INT8: case ORK_GGUF_BOOL: return 1;
    case ORK_GGUF_UINT16: case ORK_GGUF_INT16: return 2;
    case ORK_GGUF_UINT32: case ORK_GGUF_INT32: case ORK_GGUF_FLOAT32: return 4;
    case ORK_GGUF_UINT64: case ORK_GGUF_INT64: case ORK_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32); }

static ork_status need(cursor *c, uint64_t n, const char *what) {
    if (n > c->len - c->pos)
        return FAIL(c, c->pos, "truncated file: %s needs %llu bytes, only %llu left", what,
                    (unsigned long long)n, (unsigned long long)(c->len - c->pos));
    return ORK_OK;
}
static ork_status rd_u32(cursor *c, uint32_t *v, const char *what) {
    ork_status st = need(c, 4, what);
    if (st) return st;
    *v = le32(c->buf + c->pos);
    c->pos += 4;
    return ORK_OK;
}
static ork_status rd_u64(cursor *c, uint64_t *v, const char *what) {
    ork_status st = need(c, 8, what);
    if (st) return st;
    *v = le64(c->buf + c->pos);
    c->pos += 8;
    return ORK_OK;
}
/* a string: u64 length + bytes; returns its span */
static ork_status rd_str(cursor *c, uint64_t *off, uint64_t *len, const char *what) {
    uint64_t at = c->pos;
    ork_status st = rd_u64(c, len, what);
    if (st) return st;
    if (*len > c->len - c->pos)
        return FAIL(c, at, "%s length %llu exceeds the %llu bytes left in the file", what,
                    (unsigned long long)*len, (unsigned long long)(c->len - c->pos));
    *off = c->pos;
    c->pos += *len;
    return ORK_OK;
}

static int valid_utf8(const uint8_t *s, uint64_t n) {
    uint64_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        int extra;
        uint32_t cp;
        if (b < 0x80) { i++; continue; }
        else if ((b & 0xE0) == 0xC0) { extra = 1; cp = b & 0x1F; }
        else if ((b & 0xF0) == 0xE0) { extra = 2; cp = b & 0x0F; }
        else if ((b & 0xF8) == 0xF0) { extra = 3; cp = b & 0x07; }
        else return 0;
        if ((uint64_t)extra > n - i - 1) return 0;
        for (int k = 1; k <= extra; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += (uint64_t)extra + 1;
    }
    return 1;
}

/* ------------------------------------------------------ value walking -- */
/* One walker serves validation (v == NULL) and visiting (v != NULL), so the
 * visitor can only ever see what validation accepted. */
static ork_status walk_value(cursor *c, uint32_t type, int depth, const ork_gguf_visitor *v) {
    uint64_t at = c->pos;
    if (type >= ORK_GGUF_TYPE_COUNT) return FAIL(c, at, "unknown metadata value type %u", type);
    size_t sz = ork_gguf_scalar_size(type);
    if (sz) {
        ork_status st = need(c, sz, "metadata value");
        if (st) return st;
        if (type == ORK_GGUF_BOOL && c->buf[c->pos] > 1)
            return FAIL(c, at, "BOOL value is %u, not 0 or 1", c->buf[c->pos]);
        if (v && v->scalar && v->scalar(v->ctx, type, c->buf + c->pos))
            return FAIL(c, at, "visitor stopped");
        c->pos += sz;
        return ORK_OK;
    }
    if (type == ORK_GGUF_STRING) {
        uint64_t off, len;
        ork_status st = rd_str(c, &off, &len, "string value");
        if (st) return st;
        if (v && v->string && v->string(v->ctx, c->buf + off, len)) return FAIL(c, at, "visitor stopped");
        return ORK_OK;
    }
    /* array */
    if (depth >= ORK_GGUF_MAX_DEPTH)
        return FAIL(c, at, "arrays nested deeper than %d levels", ORK_GGUF_MAX_DEPTH);
    uint32_t et;
    uint64_t count;
    ork_status st = rd_u32(c, &et, "array element type");
    if (st) return st;
    if (et >= ORK_GGUF_TYPE_COUNT) return FAIL(c, at, "unknown array element type %u", et);
    st = rd_u64(c, &count, "array length");
    if (st) return st;
    size_t esz = ork_gguf_scalar_size(et);
    uint64_t left = c->len - c->pos;
    if (esz) {
        if (count > left / esz)
            return FAIL(c, at, "array of %llu %s elements needs more bytes than the %llu left",
                        (unsigned long long)count, value_type_names[et], (unsigned long long)left);
        if (et == ORK_GGUF_BOOL)
            for (uint64_t i = 0; i < count; i++)
                if (c->buf[c->pos + i] > 1)
                    return FAIL(c, c->pos + i, "BOOL array element %llu is %u, not 0 or 1",
                                (unsigned long long)i, c->buf[c->pos + i]);
        if (v && v->numeric_array && v->numeric_array(v->ctx, et, c->buf + c->pos, count))
            return FAIL(c, at, "visitor stopped");
        c->pos += count * esz;
        return ORK_OK;
    }
    /* strings (>= 8 bytes each) or arrays (>= 12 bytes each) */
    uint64_t min_elem = (et == ORK_GGUF_STRING) ? 8 : 12;
    if (count > left / min_elem)
        return FAIL(c, at, "array of %llu %s elements cannot fit in the %llu bytes left",
                    (unsigned long long)count, value_type_names[et], (unsigned long long)left);
    if (v && v->array_begin && v->array_begin(v->ctx, et, count)) return FAIL(c, at, "visitor stopped");
    for (uint64_t i = 0; i < count; i++) {
        st = walk_value(c, et, depth + 1, v);
        if (st) return st;
    }
    if (v && v->array_end && v->array_end(v->ctx)) return FAIL(c, at, "visitor stopped");
    return ORK_OK;
}

ork_status ork_gguf_visit_value(const uint8_t *buf, size_t len, uint32_t type, uint64_t value_off,
                                const ork_gguf_visitor *v, ork_err *err) {
    if (!buf || value_off > len) return ork_err_set(err, ORK_EINVAL, "bad value offset");
    cursor c = {buf, len, value_off, err};
    return walk_value(&c, type, 0, v);
}

/* ------------------------------------------------- uniqueness checking -- */
typedef struct {
    const uint8_t *p;
    uint64_t len;
    uint64_t at;
} name_ref;

static int cmp_name(const void *a, const void *b) {
    const name_ref *x = (const name_ref *)a, *y = (const name_ref *)b;
    uint64_t n = x->len < y->len ? x->len : y->len;
    int r = n ? memcmp(x->p, y->p, (size_t)n) : 0;
    if (r) return r;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->at < y->at ? -1 : (x->at > y->at);
}

static ork_status check_unique(name_ref *names, uint64_t n, const char *what, ork_err *err) {
    if (n < 2) return ORK_OK;
    qsort(names, (size_t)n, sizeof *names, cmp_name);
    for (uint64_t i = 1; i < n; i++) {
        if (names[i].len == names[i - 1].len &&
            (names[i].len == 0 || memcmp(names[i].p, names[i - 1].p, (size_t)names[i].len) == 0)) {
            int shown = names[i].len > 80 ? 80 : (int)names[i].len;
            return gguf_fail(err, names[i].at, "duplicate %s '%.*s'", what, shown, (const char *)names[i].p);
        }
    }
    return ORK_OK;
}

typedef struct {
    uint64_t off, end, at;
    uint64_t idx;
} span_ref;

static int cmp_span(const void *a, const void *b) {
    const span_ref *x = (const span_ref *)a, *y = (const span_ref *)b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

/* ---------------------------------------------------------------- parse -- */
void ork_gguf_free(ork_gguf *g) {
    if (!g) return;
    free(g->kv);
    free(g->tensors);
    memset(g, 0, sizeof *g);
}

static int key_is(const cursor *c, const ork_gguf_kv *kv, const char *s) {
    size_t n = strlen(s);
    return kv->key_len == n && memcmp(c->buf + kv->key_off, s, n) == 0;
}

ork_status ork_gguf_parse(const uint8_t *buf, size_t len, ork_gguf *g, ork_err *err) {
    if (!g) return ork_err_set(err, ORK_EINVAL, "gguf_parse: NULL output");
    memset(g, 0, sizeof *g);
    if (!buf && len) return ork_err_set(err, ORK_EINVAL, "gguf_parse: NULL buffer");
    cursor c = {buf, len, 0, err};
    ork_status st;
    name_ref *names = NULL;
    span_ref *spans = NULL;

    st = need(&c, 4, "magic");
    if (st) goto fail;
    if (memcmp(buf, "GGUF", 4) != 0) {
        st = FAIL(&c, 0, "bad magic %02x %02x %02x %02x (expected 'GGUF')", buf[0], buf[1], buf[2], buf[3]);
        goto fail;
    }
    c.pos = 4;
    uint32_t version;
    if ((st = rd_u32(&c, &version, "version"))) goto fail;
    if (version == 1) {
        st = FAIL(&c, 4, "GGUF version 1 is obsolete and not supported (convert the file to v3)");
        goto fail;
    }
    if (version != 2 && version != 3) {
        if (version && (version & 0xFFFF) == 0)
            st = FAIL(&c, 4, "GGUF version 0x%08x looks byte-swapped: big-endian files are not supported", version);
        else
            st = FAIL(&c, 4, "unsupported GGUF version %u (supported: 2, 3)", version);
        goto fail;
    }
    g->version = version;
    if ((st = rd_u64(&c, &g->n_tensors, "tensor count"))) goto fail;
    if ((st = rd_u64(&c, &g->n_kv, "metadata count"))) goto fail;
    uint64_t left = len - c.pos;
    /* smallest KV: 8 (key len) + 1 (key) + 4 (type) + 1 (u8 value) */
    if (g->n_kv > left / 14) {
        st = FAIL(&c, 16, "metadata count %llu cannot fit in a %llu-byte file", (unsigned long long)g->n_kv,
                  (unsigned long long)len);
        goto fail;
    }
    /* smallest tensor info: 8 + 1 + 4 + 8 + 4 + 8 */
    if (g->n_tensors > left / 33) {
        st = FAIL(&c, 8, "tensor count %llu cannot fit in a %llu-byte file", (unsigned long long)g->n_tensors,
                  (unsigned long long)len);
        goto fail;
    }
    g->kv = (ork_gguf_kv *)calloc((size_t)(g->n_kv ? g->n_kv : 1), sizeof *g->kv);
    g->tensors = (ork_gguf_tensor *)calloc((size_t)(g->n_tensors ? g->n_tensors : 1), sizeof *g->tensors);
    uint64_t nn = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors;
    names = (name_ref *)calloc((size_t)(nn ? nn : 1), sizeof *names);
    if (!g->kv || !g->tensors || !names) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory for %llu metadata / %llu tensor entries",
                         (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors);
        goto fail;
    }

    /* metadata */
    g->alignment = ORK_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        ork_gguf_kv *kv = &g->kv[i];
        uint64_t at = c.pos;
        if ((st = rd_str(&c, &kv->key_off, &kv->key_len, "metadata key"))) goto fail;
        if (kv->key_len == 0) {
            st = FAIL(&c, at, "empty metadata key (entry %llu)", (unsigned long long)i);
            goto fail;
        }
        if (!valid_utf8(buf + kv->key_off, kv->key_len)) {
            st = FAIL(&c, at, "metadata key of entry %llu is not valid UTF-8", (unsigned long long)i);
            goto fail;
        }
        names[i].p = buf + kv->key_off;
        names[i].len = kv->key_len;
        names[i].at = at;
        if ((st = rd_u32(&c, &kv->type, "metadata value type"))) goto fail;
        kv->value_off = c.pos;
        if ((st = walk_value(&c, kv->type, 0, NULL))) goto fail;
        if (key_is(&c, kv, "general.alignment")) {
            if (kv->type != ORK_GGUF_UINT32) {
                st = FAIL(&c, at, "general.alignment must be UINT32, got %s", ork_gguf_type_name(kv->type));
                goto fail;
            }
            uint32_t a = le32(buf + kv->value_off);
            if (a == 0 || (a & (a - 1)) != 0) {
                st = FAIL(&c, kv->value_off, "general.alignment %u is not a power of two", a);
                goto fail;
            }
            g->alignment = a;
        }
    }
    if ((st = check_unique(names, g->n_kv, "metadata key", err))) goto fail;

    /* tensor infos */
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        ork_gguf_tensor *t = &g->tensors[i];
        uint64_t at = c.pos;
        t->info_off = at;
        if ((st = rd_str(&c, &t->name_off, &t->name_len, "tensor name"))) goto fail;
        int shown = t->name_len > 63 ? 63 : (int)t->name_len;
        const char *nm = (const char *)buf + t->name_off;
        if (t->name_len == 0 || t->name_len >= ORK_GGUF_MAX_NAME) {
            st = FAIL(&c, at, "tensor %llu name length %llu is outside 1..%d", (unsigned long long)i,
                      (unsigned long long)t->name_len, ORK_GGUF_MAX_NAME - 1);
            goto fail;
        }
        names[i].p = buf + t->name_off;
        names[i].len = t->name_len;
        names[i].at = at;
        if ((st = rd_u32(&c, &t->n_dims, "tensor n_dims"))) goto fail;
        if (t->n_dims < 1 || t->n_dims > 4) {
            st = FAIL(&c, at, "tensor '%.*s' has %u dimensions (1..4 allowed)", shown, nm, t->n_dims);
            goto fail;
        }
        uint64_t nel = 1;
        for (uint32_t d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t dat = c.pos;
            if ((st = rd_u64(&c, &t->ne[d], "tensor dimension"))) goto fail;
            if (t->ne[d] == 0 || t->ne[d] >= ((uint64_t)1 << 63)) {
                st = FAIL(&c, dat, "tensor '%.*s' dimension %u is %llu", shown, nm, d, (unsigned long long)t->ne[d]);
                goto fail;
            }
            if (nel > UINT64_MAX / t->ne[d] || nel * t->ne[d] >= ((uint64_t)1 << 62)) {
                st = FAIL(&c, dat, "tensor '%.*s' element count overflows", shown, nm);
                goto fail;
            }
            nel *= t->ne[d];
        }
        t->n_elements = nel;
        uint64_t tat = c.pos;
        if ((st = rd_u32(&c, &t->type, "tensor type"))) goto fail;
        const ork_ggml_type_info *ti = ork_ggml_type(t->type);
        if (!ti) {
            st = FAIL(&c, tat, "tensor '%.*s' has unknown ggml type id %u", shown, nm, t->type);
            goto fail;
        }
        if (t->ne[0] % ti->block_size != 0) {
            st = FAIL(&c, at, "tensor '%.*s': row length %llu is not a multiple of %s's block size %u", shown, nm,
                      (unsigned long long)t->ne[0], ti->name, ti->block_size);
            goto fail;
        }
        uint64_t blocks = nel / ti->block_size;
        if (blocks > UINT64_MAX / ti->type_size) {
            st = FAIL(&c, at, "tensor '%.*s' byte size overflows", shown, nm);
            goto fail;
        }
        t->nbytes = blocks * ti->type_size;
        uint64_t oat = c.pos;
        if ((st = rd_u64(&c, &t->offset, "tensor data offset"))) goto fail;
        if (t->offset % g->alignment != 0) {
            st = FAIL(&c, oat, "tensor '%.*s' data offset %llu is not a multiple of the alignment %llu", shown, nm,
                      (unsigned long long)t->offset, (unsigned long long)g->alignment);
            goto fail;
        }
    }
    if ((st = check_unique(names, g->n_tensors, "tensor name", err))) goto fail;

    /* data section */
    uint64_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    g->data_off = c.pos + pad;
    g->size = len;
    if (g->n_tensors > 0 && g->data_off > len) {
        st = FAIL(&c, c.pos, "truncated file: the data section would start at byte %llu, past the end (%llu)",
                  (unsigned long long)g->data_off, (unsigned long long)len);
        goto fail;
    }
    spans = (span_ref *)calloc((size_t)(g->n_tensors ? g->n_tensors : 1), sizeof *spans);
    if (!spans) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory");
        goto fail;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        ork_gguf_tensor *t = &g->tensors[i];
        uint64_t room = len - g->data_off;
        if (t->offset > room || t->nbytes > room - t->offset) {
            int shown = (int)t->name_len;
            st = FAIL(&c, t->info_off,
                      "tensor '%.*s' data [%llu, +%llu) runs past the end of the file (data section holds %llu bytes)",
                      shown, (const char *)buf + t->name_off, (unsigned long long)t->offset,
                      (unsigned long long)t->nbytes, (unsigned long long)room);
            goto fail;
        }
        t->data_off = g->data_off + t->offset;
        spans[i].off = t->offset;
        spans[i].end = t->offset + t->nbytes;
        spans[i].at = t->info_off;
        spans[i].idx = i;
    }
    if (g->n_tensors > 1) {
        qsort(spans, (size_t)g->n_tensors, sizeof *spans, cmp_span);
        for (uint64_t i = 1; i < g->n_tensors; i++) {
            if (spans[i].off < spans[i - 1].end) {
                const ork_gguf_tensor *a = &g->tensors[spans[i - 1].idx], *b = &g->tensors[spans[i].idx];
                st = FAIL(&c, b->info_off, "tensor '%.*s' data overlaps tensor '%.*s'", (int)b->name_len,
                          (const char *)buf + b->name_off, (int)a->name_len, (const char *)buf + a->name_off);
                goto fail;
            }
        }
    }
    free(names);
    free(spans);
    return ORK_OK;
fail:
    free(names);
    free(spans);
    ork_gguf_free(g);
    return st;
}
