/* dequant.c - scalar ggml block dequantizers (the oracle for dequant.h).
 *
 * Every block is read byte-wise with explicit little-endian loads: the source
 * is usually an mmapped, untrusted GGUF file, so nothing here assumes any
 * alignment or casts a byte pointer to a struct or wider type. Block layouts
 * (ggml-common.h) and formulas are described next to each function; the order
 * of float32 operations is that of ggml's dequantize_row_<type> and of the
 * gguf-py NumPy dequantizers (e.g. Q4_K: (d*sc)*q - (dmin*m)), and the build
 * uses -ffp-contract=off, so the results are bit-identical to both.
 */
#include "dequant.h"

#include <stdatomic.h>
#include <string.h>
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "cpu.h"
#include "ggml_types.h"
#include "pool.h"

#define QK_K 256

/* ------------------------------------------------------------ loads -- */

static inline uint16_t ld_u16(const uint8_t *p) { return (uint16_t)(p[0] | ((uint16_t)p[1] << 8)); }

static inline uint32_t ld_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float ld_f16(const uint8_t *p) { return ork_fp16_to_fp32(ld_u16(p)); }

/* -------------------------------------------------- half conversions -- */

/* Exact binary16 -> binary32. Normal numbers, Inf and NaN are pure bit
 * manipulation (so NaN payloads, signalling or quiet, are kept as a plain
 * mantissa shift, as NumPy and F16C do). A subnormal half m * 2^-24 is built
 * as the float 2^-14 * (1 + m/1024) minus 2^-14: both operands and the result
 * are normal float32 numbers and the subtraction is exact, so the result does
 * not depend on the rounding mode or on flush-to-zero / denormals-are-zero. */
static inline uint32_t fp16_bits_to_fp32_bits(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t o = (uint32_t)(h & 0x7fffu) << 13; /* exponent and mantissa */
    const uint32_t exp = o & 0x0f800000u;
    o += (uint32_t)(127 - 15) << 23; /* rebias */
    if (exp == 0x0f800000u) {
        o += (uint32_t)(128 - 16) << 23; /* Inf / NaN: exponent 255 */
    } else if (exp == 0) {               /* zero / subnormal */
        o += 1u << 23;
        const float magic = f32_from_bits((uint32_t)113 << 23); /* 2^-14 */
        float f = f32_from_bits(o) - magic;
        memcpy(&o, &f, sizeof o);
    }
    return sign | o;
}

float ork_fp16_to_fp32(uint16_t h) { return f32_from_bits(fp16_bits_to_fp32_bits(h)); }

float ork_bf16_to_fp32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

/* ------------------------------------------------------- finiteness -- */
/* A value is non-finite iff its exponent bits are all ones: (bits & E) + lowest exponent bit carries
 * into the bit above E. */
#define ORK_FINITE_BLOCK 1024
/* a fixed trip count: the compiler vectorizes these loops at -O2 (no epilogue to cost) */
static uint32_t block_bad_f32(const uint32_t *x) {
    uint32_t bad = 0;
    for (int i = 0; i < ORK_FINITE_BLOCK; i++) bad |= (x[i] & 0x7f800000u) + 0x00800000u;
    return bad & 0x80000000u;
}

static uint32_t block_bad_f16(const uint16_t *h) {
    uint32_t bad = 0;
    for (int i = 0; i < ORK_FINITE_BLOCK; i++) bad |= (uint32_t)(h[i] & 0x7c00u) + 0x0400u;
    return bad & 0x8000u;
}

size_t ork_find_nonfinite(const void *data, size_t n, int kind) {
    const int f32 = kind == ORK_FINITE_F32;
    const uint32_t *x = (const uint32_t *)data;
    const uint16_t *h = (const uint16_t *)data;
    size_t i0 = 0;
    for (; i0 + ORK_FINITE_BLOCK <= n; i0 += ORK_FINITE_BLOCK)
        if (f32 ? block_bad_f32(x + i0) : block_bad_f16(h + i0)) break;
    for (size_t i = i0; i < n; i++)   /* the block holding one, or the tail */
        if (f32 ? (x[i] & 0x7f800000u) == 0x7f800000u : (h[i] & 0x7c00u) == 0x7c00u) return i;
    return n;
}

/* the lowest index found by any chunk: chunks run in any order, the minimum is the same */
static void atomic_min_size(_Atomic size_t *a, size_t v) {
    size_t cur = atomic_load_explicit(a, memory_order_relaxed);
    while (v < cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed, memory_order_relaxed)) {
    }
}

typedef struct {
    const uint8_t *data;
    size_t elem;
    int kind;
    _Atomic size_t first;
} finite_job;

static ork_status finite_range(void *ctx, size_t begin, size_t end, ork_err *err) {
    (void)err;
    finite_job *j = (finite_job *)ctx;
    size_t at = ork_find_nonfinite(j->data + begin * j->elem, end - begin, j->kind);
    if (at < end - begin) atomic_min_size(&j->first, begin + at);
    return ORK_OK;
}

#define ORK_FINITE_CHUNK_ELEMS 262144 /* elements per parallel work item of a scan */

size_t ork_find_nonfinite_par(const void *data, size_t n, int kind, int nthreads) {
    if (n < 2 * ORK_FINITE_CHUNK_ELEMS) return ork_find_nonfinite(data, n, kind);
    finite_job j = {(const uint8_t *)data, kind == ORK_FINITE_F32 ? 4u : 2u, kind, n};
    ork_err err;
    if (ork_parallel_for(nthreads, n, ORK_FINITE_CHUNK_ELEMS, finite_range, &j, &err) != ORK_OK)
        return ork_find_nonfinite(data, n, kind);   /* the pool could not start threads: one pass here */
    return atomic_load(&j.first);
}

/* --------------------------------------------------- plain float types -- */
/* These write bit patterns directly, so even NaN payloads are preserved. */

static void dq_f32(const uint8_t *b, float *y) {
    uint32_t u = ld_u32(b);
    memcpy(y, &u, sizeof u);
}

static void dq_f16(const uint8_t *b, float *y) {
    uint32_t u = fp16_bits_to_fp32_bits(ld_u16(b));
    memcpy(y, &u, sizeof u);
}

static void dq_bf16(const uint8_t *b, float *y) {
    uint32_t u = (uint32_t)ld_u16(b) << 16;
    memcpy(y, &u, sizeof u);
}

/* ------------------------------------------------------ legacy 32-blocks -- */

/* Q4_0 {half d; u8 qs[16]}: y[j] = ((qs[j]&15)-8)*d, y[j+16] = ((qs[j]>>4)-8)*d */
static void dq_q4_0(const uint8_t *b, float *y) {
    const float d = ld_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((int)(qs[j] & 0x0f) - 8) * d;
        y[j + 16] = (float)((int)(qs[j] >> 4) - 8) * d;
    }
}

/* Q4_1 {half d; half m; u8 qs[16]}: y = q*d + m */
static void dq_q4_1(const uint8_t *b, float *y) {
    const float d = ld_f16(b);
    const float m = ld_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0x0f) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

/* Q5_0 {half d; u8 qh[4] (u32 LE, bit j = 5th bit of element j); u8 qs[16]}:
 * y = (q5 - 16)*d */
static void dq_q5_0(const uint8_t *b, float *y) {
    const float d = ld_f16(b);
    const uint32_t qh = ld_u32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        const int x0 = (int)((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4)) - 16;
        const int x1 = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
        y[j] = (float)x0 * d;
        y[j + 16] = (float)x1 * d;
    }
}

/* Q5_1 {half d; half m; u8 qh[4]; u8 qs[16]}: y = q5*d + m */
static void dq_q5_1(const uint8_t *b, float *y) {
    const float d = ld_f16(b);
    const float m = ld_f16(b + 2);
    const uint32_t qh = ld_u32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        const uint32_t x0 = (qs[j] & 0x0fu) | (((qh >> j) & 1u) << 4);
        const uint32_t x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4);
        y[j] = (float)x0 * d + m;
        y[j + 16] = (float)x1 * d + m;
    }
}

/* Q8_0 {half d; i8 qs[32]}: y = qs*d */
static void dq_q8_0(const uint8_t *b, float *y) {
    const float d = ld_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)qs[j] * d;
}

/* IQ4_NL {half d; u8 qs[16]}: y[j] = d*kv[qs[j]&15], y[j+16] = d*kv[qs[j]>>4] */
static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};

static void dq_iq4_nl(const uint8_t *b, float *y) {
    const float d = ld_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)kvalues_iq4nl[qs[j] & 0x0f];
        y[j + 16] = d * (float)kvalues_iq4nl[qs[j] >> 4];
    }
}

/* ------------------------------------------------------------ K-quants -- */

/* Q2_K {u8 scales[16] (lo nibble: scale, hi: min); u8 qs[64]; half d; half dmin}.
 * Element 128h + 32s + l (h<2, s<4, l<32) has q = (qs[32h+l] >> 2s) & 3 and
 * belongs to sub-block i = (128h + 32s + l)/16: y = (d*sc_i)*q - (dmin*m_i). */
static void dq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *scales = b;
    const uint8_t *qs = b + 16;
    const float d = ld_f16(b + 80);
    const float dmin = ld_f16(b + 82);
    for (int h = 0; h < 2; h++) {
        for (int s = 0; s < 4; s++) {
            for (int half = 0; half < 2; half++) {
                const int e0 = 128 * h + 32 * s + 16 * half;
                const uint8_t sc = scales[e0 / 16];
                const float dl = d * (float)(sc & 0x0f);
                const float ml = dmin * (float)(sc >> 4);
                for (int l = 16 * half; l < 16 * half + 16; l++) {
                    const int q = (qs[32 * h + l] >> (2 * s)) & 3;
                    y[128 * h + 32 * s + l] = dl * (float)q - ml;
                }
            }
        }
    }
}

/* Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d}.
 * 16 six-bit scales: low 4 bits of scale i from scales[i%8] (nibble i/8), high
 * 2 bits from scales[8 + i%4] >> 2*(i/4); scale value = that - 32.
 * Element 128h + 32s + l: low 2 bits (qs[32h+l] >> 2s) & 3, and 4 is
 * subtracted when bit (4h+s) of hmask[l] is CLEAR: y = (d*sc_i) * q. */
static void dq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hmask = b;
    const uint8_t *qs = b + 32;
    const uint8_t *sb = b + 96;
    const float d = ld_f16(b + 108);
    float dl[16];
    for (int i = 0; i < 16; i++) {
        const int lo = (sb[i % 8] >> (4 * (i / 8))) & 0x0f;
        const int hi = (sb[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        dl[i] = d * (float)((lo | (hi << 4)) - 32);
    }
    for (int h = 0; h < 2; h++) {
        for (int s = 0; s < 4; s++) {
            const int hbit = 4 * h + s;
            for (int l = 0; l < 32; l++) {
                const int e = 128 * h + 32 * s + l;
                const int q = ((qs[32 * h + l] >> (2 * s)) & 3) - (((hmask[l] >> hbit) & 1) ? 0 : 4);
                y[e] = dl[e / 16] * (float)q;
            }
        }
    }
}

/* The 6-bit scale/min pairs of Q4_K/Q5_K, packed in 12 bytes:
 * j<4 : sc = q[j] & 63,                           m = q[j+4] & 63
 * j>=4: sc = (q[j+4] & 15) | ((q[j-4] >> 6) << 4), m = (q[j+4] >> 4) | ((q[j] >> 6) << 4) */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K {half d; half dmin; u8 scales[12]; u8 qs[128]}: for chunk c < 4,
 * sub-block 2c is the low nibbles of qs[32c..32c+31], 2c+1 the high nibbles;
 * y = (d*sc)*q - (dmin*m). */
static void dq_q4_k(const uint8_t *b, float *y) {
    const float d = ld_f16(b);
    const float dmin = ld_f16(b + 2);
    const uint8_t *scales = b + 4;
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++) {
        int sc, m;
        scale_min_k4(2 * c, scales, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min_k4(2 * c + 1, scales, &sc, &m);
        const float d2 = d * (float)sc, m2 = dmin * (float)m;
        const uint8_t *q = qs + 32 * c;
        float *yc = y + 64 * c;
        for (int l = 0; l < 32; l++) yc[l] = d1 * (float)(q[l] & 0x0f) - m1;
        for (int l = 0; l < 32; l++) yc[32 + l] = d2 * (float)(q[l] >> 4) - m2;
    }
}

/* Q5_K {half d; half dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: as Q4_K,
 * with the 5th bit of sub-block j's element l in bit j of qh[l]. */
static void dq_q5_k(const uint8_t *b, float *y) {
    const float d = ld_f16(b);
    const float dmin = ld_f16(b + 2);
    const uint8_t *scales = b + 4;
    const uint8_t *qh = b + 16;
    const uint8_t *qs = b + 48;
    for (int c = 0; c < 4; c++) {
        int sc, m;
        scale_min_k4(2 * c, scales, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min_k4(2 * c + 1, scales, &sc, &m);
        const float d2 = d * (float)sc, m2 = dmin * (float)m;
        const uint8_t *q = qs + 32 * c;
        float *yc = y + 64 * c;
        for (int l = 0; l < 32; l++) {
            const int x = (q[l] & 0x0f) | (((qh[l] >> (2 * c)) & 1) << 4);
            yc[l] = d1 * (float)x - m1;
        }
        for (int l = 0; l < 32; l++) {
            const int x = (q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
            yc[32 + l] = d2 * (float)x - m2;
        }
    }
}

/* Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; half d}. For half h < 2 and
 * l < 32 (ql += 64h, qh += 32h, element base 128h):
 *   e = l      : (ql[l]    & 15) | ((qh[l] >> 0) & 3) << 4
 *   e = l + 32 : (ql[l+32] & 15) | ((qh[l] >> 2) & 3) << 4
 *   e = l + 64 : (ql[l]    >> 4) | ((qh[l] >> 4) & 3) << 4
 *   e = l + 96 : (ql[l+32] >> 4) | ((qh[l] >> 6) & 3) << 4
 * y = (d*scales[e/16]) * (q - 32). */
static void dq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql0 = b;
    const uint8_t *qh0 = b + 128;
    const uint8_t *sc = b + 192;
    const float d = ld_f16(b + 208);
    float dl[16];
    for (int i = 0; i < 16; i++) dl[i] = d * (float)(int8_t)sc[i];
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = ql0 + 64 * h;
        const uint8_t *qh = qh0 + 32 * h;
        const float *dh = dl + 8 * h;
        float *yh = y + 128 * h;
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = (int)((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = (int)((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            yh[l] = dh[is + 0] * (float)q1;
            yh[l + 32] = dh[is + 2] * (float)q2;
            yh[l + 64] = dh[is + 4] * (float)q3;
            yh[l + 96] = dh[is + 6] * (float)q4;
        }
    }
}

/* IQ4_XS {half d; u16 scales_h (LE); u8 scales_l[4]; u8 qs[128]}: 8 sub-blocks
 * of 32; ls_i = ((scales_l[i/2] >> 4(i%2)) & 15 | ((scales_h >> 2i) & 3) << 4) - 32;
 * element l < 16 of sub-block i is kv[qs[16i+l] & 15], element 16+l is
 * kv[qs[16i+l] >> 4]; y = (d*ls_i) * kv. */
static void dq_iq4_xs(const uint8_t *b, float *y) {
    const float d = ld_f16(b);
    const uint16_t sh = ld_u16(b + 2);
    const uint8_t *sl = b + 4;
    const uint8_t *qs = b + 8;
    for (int i = 0; i < 8; i++) {
        const int ls = (((sl[i / 2] >> (4 * (i % 2))) & 0x0f) | (((sh >> (2 * i)) & 3) << 4)) - 32;
        const float dl = d * (float)ls;
        const uint8_t *q = qs + 16 * i;
        float *yi = y + 32 * i;
        for (int l = 0; l < 16; l++) {
            yi[l] = dl * (float)kvalues_iq4nl[q[l] & 0x0f];
            yi[l + 16] = dl * (float)kvalues_iq4nl[q[l] >> 4];
        }
    }
}

/* ------------------------------------------------------------ dispatch -- */

/* The supported types: (ggml id suffix, block function suffix, block size,
 * bytes per block). Geometry is ggml's (ggml-common.h static_asserts);
 * check_args also verifies it against the ggml_types.c table before any byte
 * is read, so the two tables can never silently disagree. */
#define ORK_DQ_TYPES(X)                                                                            \
    X(F32, f32, 1, 4)                                                                              \
    X(F16, f16, 1, 2)                                                                              \
    X(BF16, bf16, 1, 2)                                                                            \
    X(Q4_0, q4_0, 32, 18)                                                                          \
    X(Q4_1, q4_1, 32, 20)                                                                          \
    X(Q5_0, q5_0, 32, 22)                                                                          \
    X(Q5_1, q5_1, 32, 24)                                                                          \
    X(Q8_0, q8_0, 32, 34)                                                                          \
    X(Q2_K, q2_k, QK_K, 84)                                                                        \
    X(Q3_K, q3_k, QK_K, 110)                                                                       \
    X(Q4_K, q4_k, QK_K, 144)                                                                       \
    X(Q5_K, q5_k, QK_K, 176)                                                                       \
    X(Q6_K, q6_k, QK_K, 210)                                                                       \
    X(IQ4_NL, iq4_nl, 32, 18)                                                                      \
    X(IQ4_XS, iq4_xs, QK_K, 136)

/* Row wrappers: one call per run of blocks, so the block function inlines. */
typedef void (*dq_row_fn)(const uint8_t *src, size_t nblocks, float *y);

#define ORK_DQ_ROW(ID, name, bs, ts)                                                               \
    static void row_##name(const uint8_t *src, size_t nblocks, float *y) {                         \
        for (size_t i = 0; i < nblocks; i++) dq_##name(src + i * (size_t)(ts), y + i * (size_t)(bs)); \
    }
ORK_DQ_TYPES(ORK_DQ_ROW)
#undef ORK_DQ_ROW

typedef struct {
    dq_row_fn fn;
    uint32_t block_size, type_size; /* as hard-coded in the row function */
} dq_entry;

#define ORK_DQ_ENTRY(ID, name, bs, ts) [ORK_GGML_##ID] = {row_##name, bs, ts},
static const dq_entry dq_table[ORK_GGML_TYPE_COUNT] = {ORK_DQ_TYPES(ORK_DQ_ENTRY)};
#undef ORK_DQ_ENTRY

static const dq_entry *dq_lookup(uint32_t t) {
    return (t < ORK_GGML_TYPE_COUNT && dq_table[t].fn) ? &dq_table[t] : 0;
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
/* F16 rows with the F16C conversion (vcvtph2ps: exact for finite values, subnormals included whatever
 * MXCSR says), bit-identical to dq_f16 (tests/test_dequant.py: all 65536 halves on every ISA). It
 * quiets a signalling NaN, so a group of 8 holding an Inf or NaN takes the scalar path. Picked when
 * the AVX2 kernels run and the CPU has F16C (a model's F16 source is read through here: the scalar
 * loop was a quarter of `orkpy quantize`'s time). */
__attribute__((target("avx,f16c"))) static void row_f16_f16c(const uint8_t *src, size_t nblocks, float *y) {
    const __m128i expo = _mm_set1_epi16(0x7c00);
    size_t i = 0;
    for (; i + 8 <= nblocks; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(src + 2 * i));
        if (_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(h, expo), expo))) {
            for (size_t k = i; k < i + 8; k++) dq_f16(src + 2 * k, y + k);
            continue;
        }
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
    }
    for (; i < nblocks; i++) dq_f16(src + 2 * i, y + i);
}

static dq_row_fn row_fn_for(uint32_t t, dq_row_fn fn) {
    if (t == ORK_GGML_F16 && ork_cpu_isa() == ORK_ISA_AVX2 && (ork_cpu_features() & ORK_CPU_F16C)) return row_f16_f16c;
    return fn;
}
#else
static dq_row_fn row_fn_for(uint32_t t, dq_row_fn fn) {
    (void)t;
    return fn;
}
#endif

int ork_dequant_supported(uint32_t ggml_type) { return ork_ggml_type(ggml_type) && dq_lookup(ggml_type); }

/* Validates (type, n, pointers); on success sets *info and *fn. */
static ork_status check_args(uint32_t t, const void *src, size_t n, const float *dst,
                             const ork_ggml_type_info **info, dq_row_fn *fn, ork_err *err) {
    const ork_ggml_type_info *ti = ork_ggml_type(t);
    if (!ti) return ork_err_set(err, ORK_EINVAL, "invalid ggml type id %u", (unsigned)t);
    const dq_entry *e = dq_lookup(t);
    if (!e) return ork_err_set(err, ORK_ENOTIMPL, "dequantization of %s is not implemented", ti->name);
    if (e->block_size != ti->block_size || e->type_size != ti->type_size)
        return ork_err_set(err, ORK_EINVAL, "%s: internal block geometry mismatch (%u/%u vs %u/%u)",
                           ti->name, (unsigned)e->block_size, (unsigned)e->type_size,
                           (unsigned)ti->block_size, (unsigned)ti->type_size);
    dq_row_fn f = row_fn_for(t, e->fn);
    if (n % ti->block_size != 0)
        return ork_err_set(err, ORK_EINVAL,
                           "%s: element count %zu is not a multiple of the block size %u", ti->name, n,
                           (unsigned)ti->block_size);
    if (n > 0 && (!src || !dst))
        return ork_err_set(err, ORK_EINVAL, "%s: NULL source or destination buffer", ti->name);
    *info = ti;
    *fn = f;
    return ORK_OK;
}

static void run_blocks(dq_row_fn fn, const ork_ggml_type_info *ti, const uint8_t *src, size_t b0,
                       size_t b1, float *dst) {
    fn(src + b0 * ti->type_size, b1 - b0, dst + b0 * ti->block_size);
}

ork_status ork_dequant_row(uint32_t ggml_type, const void *src, size_t n, float *dst, ork_err *err) {
    const ork_ggml_type_info *ti;
    dq_row_fn fn;
    ork_status st = check_args(ggml_type, src, n, dst, &ti, &fn, err);
    if (st != ORK_OK) return st;
    run_blocks(fn, ti, (const uint8_t *)src, 0, n / ti->block_size, dst);
    return ORK_OK;
}

typedef struct {
    dq_row_fn fn;
    const ork_ggml_type_info *ti;
    const uint8_t *src;
    float *dst;
    int check;              /* scan each chunk's output while it is in cache */
    _Atomic size_t first;   /* the lowest non-finite element index found */
} dq_job;

static ork_status dq_range(void *ctx, size_t begin, size_t end, ork_err *err) {
    (void)err;
    dq_job *j = (dq_job *)ctx;
    run_blocks(j->fn, j->ti, j->src, begin, end, j->dst);
    if (j->check) {
        const size_t bs = j->ti->block_size, n = (end - begin) * bs;
        size_t at = ork_find_nonfinite(j->dst + begin * bs, n, ORK_FINITE_F32);
        if (at < n) atomic_min_size(&j->first, begin * bs + at);
    }
    return ORK_OK;
}

#define ORK_DEQUANT_CHUNK_ELEMS 65536 /* elements per parallel work item */

ork_status ork_dequant_tensor_checked(uint32_t ggml_type, const void *src, size_t n, float *dst, int nthreads,
                                      size_t *nonfinite, ork_err *err) {
    const ork_ggml_type_info *ti;
    dq_row_fn fn;
    if (nonfinite) *nonfinite = n;
    ork_status st = check_args(ggml_type, src, n, dst, &ti, &fn, err);
    if (st != ORK_OK) return st;
    const size_t nblocks = n / ti->block_size;
    if (nblocks == 0) return ORK_OK;
    size_t chunk = ORK_DEQUANT_CHUNK_ELEMS / ti->block_size;
    if (chunk == 0) chunk = 1;
    dq_job j = {fn, ti, (const uint8_t *)src, dst, nonfinite != NULL, n};
    st = ork_parallel_for(nthreads, nblocks, chunk, dq_range, &j, err);
    if (st == ORK_OK && nonfinite) *nonfinite = atomic_load(&j.first);
    return st;
}

ork_status ork_dequant_tensor(uint32_t ggml_type, const void *src, size_t n, float *dst, int nthreads,
                              ork_err *err) {
    return ork_dequant_tensor_checked(ggml_type, src, n, dst, nthreads, NULL, err);
}
