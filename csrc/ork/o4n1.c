/* o4n1.c - the O4N1/O8N1 header codec and file validation (o4n1.h). */
#include "o4n1.h"

#include <math.h>
#include <string.h>

#include "affine.h"
#include "half.h"
#include "pack.h"

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32); }

uint64_t ork_o4n1_store_offset(uint64_t N) { return (ORK_O4N1_HEADER + 4 * N + 63) & ~(uint64_t)63; }

/* the layout written for a group size: version, header bytes, scale count, store offset */
static void layout_of(uint64_t N, uint64_t K, uint64_t group, int affine, uint32_t *version, uint32_t *hbytes,
                      uint64_t *nscales, uint64_t *soff) {
    int grouped = group != 0 && group < K;
    affine = affine && grouped;
    *version = affine ? ORK_O4N1_VERSION_AFFINE : grouped ? ORK_O4N1_VERSION_F16 : ORK_O4N1_VERSION;
    *hbytes = grouped ? ORK_O4N1_HEADER_GROUPED : ORK_O4N1_HEADER;
    *nscales = N * (grouped ? (K + group - 1) / group : 1);
    *soff = (*hbytes + (uint64_t)(grouped ? 2 : 4) * (affine ? 2 : 1) * *nscales + 63) & ~(uint64_t)63;
}

uint64_t ork_o4n1_grouped_store_offset(uint64_t N, uint64_t K, uint64_t group, int affine) {
    uint32_t v, h;
    uint64_t ns, soff;
    layout_of(N, K, group, affine, &v, &h, &ns, &soff);
    return soff;
}

const char *ork_o4n1_magic(ork_kind kind) {
    const ork_kind_info *k = ork_kind_get(kind);
    return !k ? NULL : k->bits == 8 ? "O8N1" : "O4N1";
}

ork_status ork_o4n1_header(ork_kind kind, uint64_t N, uint64_t K, uint64_t group, int affine,
                           uint8_t hdr[ORK_O4N1_HEADER_GROUPED], size_t *hdr_bytes, ork_err *err) {
    ork_status st = ork_kind_check(kind, err);
    if (st == ORK_OK) st = ork_group_check((size_t)group, err);
    if (st == ORK_OK && affine) st = ork_affine_check(kind, (size_t)K, (size_t)group, err);
    if (st) return st;
    if (N == 0 || K == 0 || K > ORK_PACK_MAX_K || N > ORK_PACK_MAX_N)
        return ork_err_set(err, ORK_EINVAL, "bad packed weight shape (%llu, %llu)", (unsigned long long)N,
                           (unsigned long long)K);
    uint32_t version, hbytes;
    uint64_t nscales, soff;
    layout_of(N, K, group, affine, &version, &hbytes, &nscales, &soff);
    memset(hdr, 0, ORK_O4N1_HEADER_GROUPED);
    memcpy(hdr, ork_o4n1_magic(kind), 4);
    put32(hdr + 4, version);
    put32(hdr + 8, (uint32_t)kind);
    put32(hdr + 12, hbytes);
    put64(hdr + 16, K);
    put64(hdr + 24, N);
    const int8_t *lut = ork_quant_lut(kind);
    if (lut) memcpy(hdr + 32, lut, 16);
    put64(hdr + 48, soff);
    put64(hdr + 56, ork_pack_file_store_bytes(kind, (size_t)N, (size_t)K));
    if (version == ORK_O4N1_VERSION_F16 || version == ORK_O4N1_VERSION_AFFINE) {
        put32(hdr + 64, (uint32_t)group);
        put32(hdr + 68, (uint32_t)(nscales / N));
    }
    *hdr_bytes = hbytes;
    return ORK_OK;
}

#define BAD(...) ork_err_set(err, ORK_EFORMAT, __VA_ARGS__)

ork_status ork_o4n1_parse(const uint8_t *buf, size_t len, ork_o4n1_info *info, ork_err *err) {
    if (!buf || !info) return ork_err_set(err, ORK_EINVAL, "o4n1_parse: NULL argument");
    if (len < ORK_O4N1_HEADER)
        return BAD("truncated: %zu bytes is shorter than the %d-byte header", len, ORK_O4N1_HEADER);
    int is8;
    if (memcmp(buf, "O4N1", 4) == 0) is8 = 0;
    else if (memcmp(buf, "O8N1", 4) == 0) is8 = 1;
    else return BAD("bad magic %02x %02x %02x %02x (expected 'O4N1' or 'O8N1')", buf[0], buf[1], buf[2], buf[3]);
    uint32_t version = get32(buf + 4), kind = get32(buf + 8), hbytes = get32(buf + 12);
    if (version < ORK_O4N1_VERSION || version > ORK_O4N1_VERSION_AFFINE)
        return BAD("unsupported version %u (this orkpy reads versions %d to %d)", version, ORK_O4N1_VERSION,
                   ORK_O4N1_VERSION_AFFINE);
    const uint32_t want_h = version == ORK_O4N1_VERSION ? ORK_O4N1_HEADER : ORK_O4N1_HEADER_GROUPED;
    if (len < want_h) return BAD("truncated: %zu bytes is shorter than the %u-byte header", len, want_h);
    const ork_kind_info *ki = kind < ORK_KIND_MAX ? ork_kind_get((ork_kind)kind) : NULL;
    if (!ki || (ki->bits == 8) != is8)
        return BAD("unknown kind %u for a %s file", kind, is8 ? "O8N1" : "O4N1");
    if (hbytes != want_h) return BAD("header size field is %u, expected %u", hbytes, want_h);
    uint64_t K = get64(buf + 16), N = get64(buf + 24);
    if (K == 0 || N == 0 || K > ORK_PACK_MAX_K || N > ORK_PACK_MAX_N)
        return BAD("bad shape N = %llu, K = %llu", (unsigned long long)N, (unsigned long long)K);
    uint64_t group = 0, G = 1;
    const int affine = version == ORK_O4N1_VERSION_AFFINE;
    const uint32_t sb = version >= ORK_O4N1_VERSION_F16 ? 2 : 4; /* bytes per scale */
    if (version != ORK_O4N1_VERSION) {
        group = get32(buf + 64);
        G = get32(buf + 68);
        if (group == 0 || group % 32 || group > ORK_GROUP_MAX || group >= K)
            return BAD("bad group size %llu for K = %llu (a multiple of 32 in [32, %d], below K)",
                       (unsigned long long)group, (unsigned long long)K, ORK_GROUP_MAX);
        if (G != (K + group - 1) / group)
            return BAD("group count %llu, expected %llu for K = %llu and group size %llu", (unsigned long long)G,
                       (unsigned long long)((K + group - 1) / group), (unsigned long long)K, (unsigned long long)group);
    }
    const uint64_t NS = N * G;
    if (affine) {
        ork_err e2;
        if (ork_affine_check((ork_kind)kind, (size_t)K, (size_t)group, &e2) != ORK_OK) return BAD("version 4: %s", e2.msg);
    }
    if (memcmp(buf + 32, ki->lut, 16) != 0) /* all zero for 8-bit kinds */
        return BAD("LUT in the header does not match kind %u", kind);
    uint64_t soff = get64(buf + 48), sbytes = get64(buf + 56);
    const uint64_t want_off = (hbytes + (uint64_t)sb * (affine ? 2 : 1) * NS + 63) & ~(uint64_t)63;
    if (soff != want_off)
        return BAD("store offset %llu, expected %llu for N = %llu and %llu scales per row", (unsigned long long)soff,
                   (unsigned long long)want_off, (unsigned long long)N, (unsigned long long)G);
    uint64_t want = ork_pack_file_store_bytes((ork_kind)kind, (size_t)N, (size_t)K);
    if (sbytes != want) return BAD("store size %llu, expected %llu for N = %llu, K = %llu", (unsigned long long)sbytes,
                                   (unsigned long long)want, (unsigned long long)N, (unsigned long long)K);
    if ((uint64_t)len != soff + sbytes)
        return BAD("file is %zu bytes but the header describes %llu (truncated or trailing data)", len,
                   (unsigned long long)(soff + sbytes));
    const double cap = ork_pack_max_scale((size_t)K);
    for (uint64_t n = 0; n < NS; n++) {
        uint32_t bits;
        float s;
        if (sb == 2) { /* float16: widened exactly */
            const uint16_t h = (uint16_t)(buf[hbytes + 2 * n] | (buf[hbytes + 2 * n + 1] << 8));
            s = ork_f16_to_f32(h);
            memcpy(&bits, &s, 4);
        } else {
            bits = get32(buf + hbytes + 4 * n);
            memcpy(&s, &bits, 4);
        }
        if (!isfinite(s) || s < 0.0f || (bits == 0x80000000u))
            return BAD("scale[%llu] = %g is not a finite non-negative number", (unsigned long long)n, (double)s);
        if ((double)s > cap)
            return BAD("scale[%llu] = %g exceeds %g, the largest scale for K = %llu (scale * 127 * 127 * K must fit "
                       "float32)", (unsigned long long)n, (double)s, cap, (unsigned long long)K);
    }
    const uint64_t ooff = affine ? hbytes + 2 * NS : 0; /* the offsets (version 4) */
    for (uint64_t n = 0; affine && n < NS; n++) {
        const float o = ork_f16_to_f32((uint16_t)(buf[ooff + 2 * n] | (buf[ooff + 2 * n + 1] << 8)));
        if (!isfinite(o)) return BAD("offset[%llu] is not finite", (unsigned long long)n);
    }
    for (uint64_t p = hbytes + (uint64_t)sb * (affine ? 2 : 1) * NS; p < soff; p++)
        if (buf[p] != 0) return BAD("non-zero padding byte at offset %llu", (unsigned long long)p);
    if (ki->bits == 8 && ki->store_bits < 8) { /* a narrow store: every code decodes into [qmin, qmax] */
        ork_err e2;
        if (ork_unpack_bits((ork_kind)kind, buf + soff, (size_t)(sbytes / (uint64_t)ki->store_bits * 8), NULL, &e2) != ORK_OK)
            return BAD("%s", e2.msg);
    } else if (ki->bits == 8)
        for (uint64_t p = soff; p < soff + sbytes; p++)
            if (buf[p] == 0x80) return BAD("int8 store holds -128 at offset %llu (codes must be in [-127, 127])", (unsigned long long)p);
    ork_status pst = ork_pack_check_padding((ork_kind)kind, buf + soff, (size_t)N, (size_t)K, 1, soff, ORK_EFORMAT, err);
    if (pst != ORK_OK) return pst;
    info->kind = (ork_kind)kind;
    info->K = K;
    info->N = N;
    info->scales_off = hbytes;
    info->group = group;
    info->G = G;
    info->version = version;
    info->scale_bytes = sb;
    info->offsets_off = ooff;
    info->store_off = soff;
    info->store_bytes = sbytes;
    return ORK_OK;
}
