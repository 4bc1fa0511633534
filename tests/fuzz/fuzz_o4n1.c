/* fuzz_o4n1.c - libFuzzer target for the O4N1/O8N1 parser (csrc/ork/o4n1.c)
 * and what load_packed does with a parsed file: the store and scales go to the
 * int8 matmul kernels (csrc/ork/pack.c + every ISA's kernels).
 *
 * For every input: ork_o4n1_parse over exactly the input bytes (libFuzzer's
 * heap block has exactly `size` bytes, so a one-byte over-read is an ASan
 * report). On success the documented invariants are checked (a violation is a
 * bug: __builtin_trap): the info describes the buffer exactly (versions 1, 2
 * and 3: float32 or float16 scales, per channel or group-wise), every scale is
 * finite and >= 0, an int8 store holds no -128. When N*K is small the store is
 * unpacked and, for M = 1 (GEMV) and M = 3 (GEMM) activation rows derived
 * from the input, every ISA this CPU runs must give the exact int32
 * accumulators of a naive reference, and the float path must equal
 * ((float)acc * ascale) * bscale bit for bit on every ISA (group-wise: the
 * groups' terms added in order, pack.h).
 *
 * Built by tests/fuzz/build.sh; seeds: seeds_o4n1.py (files written by
 * orkpy.save_packed) and tests/fuzz/corpus/o4n1/; run by tests/fuzz/run.py.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "half.h"
#include "o4n1.h"
#include "pack.h"
#include "quant.h"

#define FUZZ_MAX_ELEMS ((uint64_t)1 << 16)
#define FUZZ_MAX_M 3

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* scale i of a parsed file, widened to float32 (float16 in version 3) */
static float scale_at(const uint8_t *data, const ork_o4n1_info *info, uint64_t i) {
    const uint8_t *p = data + info->scales_off + info->scale_bytes * i;
    if (info->scale_bytes == 2) return ork_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
    uint32_t bits = get32(p);
    float s;
    memcpy(&s, &bits, 4);
    return s;
}

/* activations from the input bytes (deterministic), int8 in [-127, 127] */
static void make_x(const uint8_t *data, size_t size, size_t M, size_t K, int8_t *xq, float *xf) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < size && i < 64; i++) h = (h ^ data[i]) * 16777619u;
    for (size_t i = 0; i < M * K; i++) {
        h = h * 1103515245u + 12345u;
        int v = (int)((h >> 16) % 255u) - 127;
        xq[i] = (int8_t)v;
        xf[i] = (float)v * 0.25f;
    }
}

static void check_compute(const uint8_t *data, size_t size, const ork_o4n1_info *info) {
    const size_t N = (size_t)info->N, K = (size_t)info->K;
    const ork_kind kind = info->kind;
    const int four = kind != ORK_KIND_INT8;
    const int8_t *lut = ork_quant_lut(kind);
    const void *store = data + info->store_off;
    const size_t G = (size_t)info->G, gs = info->group ? (size_t)info->group : K;
    float *bscale = (float *)malloc(N * G * sizeof(float)); /* the file's bytes need not be aligned */
    for (size_t i = 0; i < N * G; i++) bscale[i] = scale_at(data, info, i);

    /* row-major codes -> int8 weights W[n][k] */
    size_t rb = four ? (K + 1) / 2 : K;
    uint8_t *codes = (uint8_t *)malloc(N * rb);
    int8_t *w = (int8_t *)malloc(N * K);
    ork_err err;
    CHECK(ork_unpack(kind, store, N, K, codes, &err) == ORK_OK);
    for (size_t n = 0; n < N; n++)
        for (size_t k = 0; k < K; k++) {
            uint8_t c = codes[n * rb + (four ? k / 2 : k)];
            if (four) {
                c = (k & 1) ? (uint8_t)(c >> 4) : (uint8_t)(c & 15);
                w[n * K + k] = lut[c];
            } else {
                w[n * K + k] = (int8_t)c;
                CHECK(w[n * K + k] != -128);
            }
        }

    int8_t *xq = (int8_t *)malloc(FUZZ_MAX_M * K);
    float *xf = (float *)malloc(FUZZ_MAX_M * K * sizeof(float));
    int32_t *want = (int32_t *)malloc(FUZZ_MAX_M * N * sizeof(int32_t));
    int32_t *acc = (int32_t *)malloc(FUZZ_MAX_M * N * sizeof(int32_t));
    float *y = (float *)malloc(FUZZ_MAX_M * N * sizeof(float));
    float *yref = (float *)malloc(FUZZ_MAX_M * N * sizeof(float));
    size_t Kp = ork_pack_round32(K);
    int8_t *xa = (int8_t *)malloc(FUZZ_MAX_M * Kp);
    float *ascale = (float *)malloc(FUZZ_MAX_M * sizeof(float));
    int8_t *xa0 = (int8_t *)malloc(FUZZ_MAX_M * Kp);
    float *ascale0 = (float *)malloc(FUZZ_MAX_M * sizeof(float));
    make_x(data, size, FUZZ_MAX_M, K, xq, xf);

    static const size_t Ms[2] = {1, FUZZ_MAX_M};
    for (int mi = 0; mi < 2; mi++) {
        const size_t M = Ms[mi];
        for (size_t m = 0; m < M; m++)
            for (size_t n = 0; n < N; n++) {
                int64_t s = 0;
                for (size_t k = 0; k < K; k++) s += (int64_t)xq[m * K + k] * w[n * K + k];
                CHECK(s >= INT32_MIN && s <= INT32_MAX);
                want[m * N + n] = (int32_t)s;
            }
        for (int isa = 0; isa < ORK_ISA_COUNT; isa++) {
            if (!ork_isa_available((ork_isa)isa)) continue; /* scalar (0) always is */
            CHECK(ork_cpu_set_isa(ork_isa_name((ork_isa)isa), &err) == ORK_OK);
            CHECK(ork_matmul_int(kind, store, lut, N, K, xq, M, acc, 1, &err) == ORK_OK);
            CHECK(memcmp(acc, want, M * N * sizeof(int32_t)) == 0);
            /* float path: quantized activations, then ((float)acc * a) * bscale */
            CHECK(ork_quantize_activations(xf, M, K, Kp, 0, xa, ascale, &err) == ORK_OK);
            if (isa == ORK_ISA_SCALAR) {
                memcpy(xa0, xa, M * Kp);
                memcpy(ascale0, ascale, M * sizeof(float));
            } else { /* the activation quantizer gives the same bits on every ISA */
                CHECK(memcmp(xa0, xa, M * Kp) == 0 && memcmp(ascale0, ascale, M * sizeof(float)) == 0);
            }
            for (size_t m = 0; m < M; m++)
                for (size_t n = 0; n < N; n++) {
                    float yv = 0.0f;
                    for (size_t g = 0; g < G; g++) {
                        int32_t s = 0;
                        for (size_t k = g * gs; k < K && k < (g + 1) * gs; k++)
                            s += (int32_t)xa[m * Kp + k] * w[n * K + k];
                        float t = (float)s * ascale[m];
                        t = t * bscale[n * G + g];
                        yv = g ? yv + t : t;
                    }
                    yref[m * N + n] = yv;
                }
            if (G == 1) CHECK(ork_matmul_f32(kind, store, lut, bscale, N, K, xf, M, 0, y, 1, &err) == ORK_OK);
            else
                CHECK(ork_matmul_q8_grouped(kind, store, lut, bscale, gs, N, K, xa, ascale, 0, M, y, 1, &err) == ORK_OK);
            CHECK(memcmp(y, yref, M * N * sizeof(float)) == 0);
        }
    }
    ork_cpu_set_isa("auto", &err);
    free(bscale);
    free(codes);
    free(w);
    free(xq);
    free(xf);
    free(want);
    free(acc);
    free(y);
    free(yref);
    free(xa);
    free(ascale);
    free(xa0);
    free(ascale0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ork_o4n1_info info;
    ork_err err;
    err.msg[0] = '\0';
    memset(&info, 0xA5, sizeof info);
    ork_status st = ork_o4n1_parse(data, size, &info, &err);
    if (st != ORK_OK) {
        CHECK(st == ORK_EFORMAT);
        CHECK(err.msg[0] != '\0' && memchr(err.msg, '\0', sizeof err.msg) != NULL);
        return 0;
    }
    /* the documented invariants of an accepted file */
    CHECK(size >= ORK_O4N1_HEADER);
    CHECK(info.kind == ORK_KIND_NF4 || info.kind == ORK_KIND_INT4 || info.kind == ORK_KIND_INT8);
    CHECK(memcmp(data, info.kind == ORK_KIND_INT8 ? "O8N1" : "O4N1", 4) == 0);
    CHECK(info.N >= 1 && info.N <= ORK_PACK_MAX_N && info.K >= 1 && info.K <= ORK_PACK_MAX_K);
    CHECK(info.version >= 1 && info.version <= 3);
    CHECK(info.scales_off == (info.version == 1 ? ORK_O4N1_HEADER : ORK_O4N1_HEADER_GROUPED));
    CHECK(info.scale_bytes == (info.version == 3 ? 2u : 4u));
    CHECK(info.version == 1 ? (info.group == 0 && info.G == 1)
                            : (info.group % 32 == 0 && info.group >= 32 && info.group < info.K &&
                               info.G == (info.K + info.group - 1) / info.group));
    CHECK(info.store_off >= info.scales_off + info.scale_bytes * info.N * info.G && info.store_off % 64 == 0);
    CHECK(info.store_bytes == ork_pack_store_bytes(info.kind, (size_t)info.N, (size_t)info.K));
    CHECK(info.store_off + info.store_bytes == size);
    for (uint64_t i = 0; i < info.N * info.G; i++) {
        float s = scale_at(data, &info, i);
        uint32_t bits;
        memcpy(&bits, &s, 4);
        CHECK((bits & 0x7F800000u) != 0x7F800000u); /* finite */
        CHECK(bits == 0 || (bits >> 31) == 0);      /* >= 0, no -0 */
    }
    if (info.N * info.K <= FUZZ_MAX_ELEMS) check_compute(data, size, &info);
    return 0;
}
