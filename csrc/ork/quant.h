/* quant.h - orkpy's weight quantizers: NF4, uniform int4 (both "int4-stored /
 * int8-computed") and per-channel int8.
 *
 * ---------------------------------------------------------------- contract --
 * Input: float32 weight W of shape (N, K), row-major: N output channels, K
 * inputs. Every row n gets one float32 scale s[n] >= 0 (group-wise scales,
 * below: one float16 value per segment).
 *
 * Kinds: every quantization kind is one row of the kind registry (quant.c,
 * ork_kind_info below); nothing else in the tree lists kinds. A row gives the
 * name, the bits per code, the nominal levels and the code of level 0; the
 * LUT and the quantization grid are derived from the levels by one function.
 *
 * 4-bit kinds (bits == 4: ORK_KIND_NF4, ORK_KIND_INT4)
 *   - Each kind has a 16-entry int8 LUT; a code is a 4-bit index into it and
 *     dequant(n,k) = (float)lut[code] * s[n]  (one float32 multiply).
 *     lut[c] = round(levels[c] * 127) for the kind's nlev <= 16 ascending
 *     levels in [-1, 1]; codes >= nlev are never produced and map to 0.
 *       NF4 : bitsandbytes' 16 levels (code 0 = -1.0 -> -127,
 *             code 7 = 0.0 -> 0, code 15 = 1.0 -> 127).
 *       INT4: uniform symmetric levels k/7, k = -7..7 -> lut[k+7] = round(k*127/7)
 *             (codes 0..14).
 *     round() is half away from zero. Every 4-bit kind has an exact 0.0
 *     level; its code is the row's zero_code (7 for NF4 and INT4).
 *   - The quantization grid IS the LUT: a value is rounded to the nearest of
 *     the kind's int8 levels (the values the int8 hardware will multiply), so
 *     the thresholds are the midpoints between adjacent LUT levels. A value
 *     exactly on a midpoint takes the LOWER code (strict `y > t` compares, as
 *     in bitsandbytes' dQuantizeNF4).
 *   - Normalisation: for a row with absmax a and clip ratio r,
 *         m = a * r;   s = m / 127;   inv = 127 / m;   y = w * inv
 *     (each a single float32 operation, no fused multiply-add anywhere), and
 *     the code is the count of thresholds t with y > t.
 *   - Storage: two codes per byte, element 2j in the LOW nibble and element
 *     2j+1 in the HIGH nibble; rows are padded to ceil(K/2) bytes, a padding
 *     nibble holds the kind's zero_code.
 *
 * 8-bit kinds (bits == 8: ORK_KIND_INT8, ORK_KIND_INT6, ORK_KIND_INT5): codes are
 *   int8 in [-Q, Q] with Q = the row's qmax (127, 31, 15):
 *     m = a * r;   s = m / Q;   inv = Q / m;   y = w * inv
 *     q = clamp(round_half_away(y), -Q, Q), dequant = (float)q * s.
 *   int6 / int5 ("i6a8" / "i5a8": 6/5-bit stored, int8 computed) are uniform
 *   symmetric grids with 63 / 31 levels. In memory their codes are int8 (the
 *   int8 tile store, pack.h: every int8 kernel and the NPU run them unchanged);
 *   a file stores store_bits per code (O8N1 version 4, docs/o4n1.md), so their
 *   bytes per weight are 6/8 and 5/8 of int8's on disk (the NPU reads int8 from
 *   DRAM: on the board they cost int8's bandwidth).
 *   w4a4 (ORK_KIND_W4A4, qmax 7, store_bits 4, act_bits 4) is the same family
 *   with 4-bit integer codes: unlike the int4 codebook (whose LUT levels
 *   round(k*127/7) are not a multiple of one step), dequant = code * s
 *   exactly, so the NPU's int4 x int4 -> int16 mode can multiply its codes
 *   with 4-bit activation codes (act_bits 4: its linears quantize their input
 *   to [-7, 7], actspec.h). In memory its codes are int8 like int5 / int6;
 *   on the NPU two codes per byte (docs/w4a4.md).
 *   w4a8 (ORK_KIND_W4A8) stores the same codes and keeps int8 activations
 *   (act_bits 8): on the NPU each int8 activation x = 16 h + l is split into
 *   two int4 digits h = floor((x + 8) / 16), l = x - 16 h (both in [-8, 7]),
 *   two rows of the int4 x int4 mode, combined 16 acc_h + acc_l in int32 --
 *   exactly the int8 x code product the CPU kernels compute, at 4 NPU bits
 *   per weight (docs/w4a4.md "W4A8 by digits").
 *
 * Rows: absmax a == 0 (or a < ORK_QUANT_TINY, documented as zero) gives
 * s = 0, every code = the zero level, and dequantizes to exact zeros.
 *
 * imatrix (nullable, float32 (K,), finite, >= 0): per row the ratio r is
 *   chosen from a grid of clip ratios to minimise
 *       E(r) = sum_k imatrix[k] * (w[n,k] - dequant_r(n,k))^2
 *   with nearest rounding. r = 1.0 (plain absmax) is always evaluated FIRST
 *   and a later candidate replaces the best only when strictly smaller, so
 *   E never exceeds plain absmax and ties keep absmax. E is accumulated in
 *   double precision in four interleaved lanes (lane = k mod 4, each lane in
 *   increasing k, combined as (l0+l1)+(l2+l3)), with d = w - lut*s in float32,
 *   term = (double)imatrix[k] * ((double)d * (double)d). Every SIMD variant
 *   reproduces this order exactly. imatrix == NULL skips the search entirely,
 *   so its output is byte-identical to plain absmax.
 *
 * Screened clip search (4-bit kinds, segments of n >= ORK_SCREEN_MIN_N values):
 *   the grid is not evaluated in full. A histogram of the segment, bin
 *   b = clamp(trunc((x * (1/a) + 1) * B/2), 0, B-1) with B = ORK_SCREEN_BINS
 *   (2048) and every operation in double, holds S0 = sum im and S1 = sum im * x (in
 *   increasing k). The sum of the bins below i (i >= 1) is off[j] + run[i-1],
 *   j = (i-1) / ORK_SCREEN_BLOCK: run the running sum inside each block of
 *   ORK_SCREEN_BLOCK bins, off[j] = off[j-1] + (block j-1's total), off[0] = 0;
 *   below 0 it is 0. Each grid ratio but 1.0 gets
 *   an estimate: level c owns the bins between the boundaries of thresholds
 *   c-1 and c, boundary = clamp(trunc((thr * ((1/a) / inv) + 1) * B/2 + 0.5),
 *   0, B), and adds L*L*S0 - 2*L*S1 with L = lev[c] * s (E less the
 *   candidate-independent sum im*x^2; only values in a bin that straddles a
 *   threshold are misplaced, by less than a bin's width; inv = 0: 0). The
 *   ORK_SCREEN_TOP best estimates (first in grid order on ties) are then
 *   evaluated exactly with 1.0, 1.0 first and the picks in grid order, and
 *   the exact E chooses as above. So E still never exceeds plain absmax, and
 *   the result equals the full search's whenever the full search's best is
 *   among the picks (measured: all but 9 of 155,520 rows of SmolLM2-135M and
 *   12 of 124,416 of Gemma-3-270M; the model's weighted error +2e-7 for both;
 *   docs/quantization.md). With 1.0 the picks are ORK_WERR_BATCH candidates:
 *   one pass of werr4n. 8-bit kinds, segments of fewer than 512 values
 *   and ork_quant_params.full_search = 1 search the grid in full. The screen's
 *   bins and the estimates are the kernels screen_bins / screen_est, each bit
 *   for bit its scalar _ref, so the choice is the same on every ISA.
 *
 * Pruned full search (8-bit kinds: int8, int6, int5; segments of at least
 *   ORK_PRUNE_MIN_N values; full_search = 0 or 1 alike): the chosen ratio is
 *   bit for bit the full search's, with fewer candidates evaluated exactly.
 *   The tail T is the first ORK_PRUNE_TAIL values (in increasing k) with
 *   |x| >= ORK_PRUNE_TAU * a. Every term of E is >= 0, so the same error
 *   kernel run over T alone (LB(r), the tail's values and importances packed
 *   in order) is a lower bound of E(r) up to rounding: both are sums of fewer
 *   than 2^32 non-negative terms that are identical term by term, so
 *   computed E(r) >= LB(r) * (1 - 2^-20). Candidates are evaluated exactly
 *   ORK_WERR_BATCH at a time: first 1.0 and the ORK_WERR_BATCH - 1 smallest
 *   bounds (first in the full search's order on ties), then the rest in that
 *   order, skipping every r with LB(r) * (1 - 2^-20) > the best exact E so far
 *   (its E exceeds the best, so the full search could not take it). The
 *   choice is the smallest exact E, the earliest in the full search's order
 *   (1.0, then the grid without 1.0) on ties: the full search's choice. Only
 *   the number of candidates evaluated depends on T (and so on the data).
 *
 * Stochastic rounding (sr != 0): after the scale is chosen, y is rounded to
 *   one of its two bracketing levels lo <= y < hi with P(hi) = (y-lo)/(hi-lo),
 *   so E[dequant] = w inside the level range (values beyond the end levels
 *   take the end level). The uniform u in [0,1) is (h >> 8) * 2^-24 with
 *   h = ork_sr_hash(row_key, col), row_key = ork_sr_row_key(seed, row): a
 *   counter-based generator, hence identical for any thread count and any
 *   ISA. "up" iff u < p, p = (y - lo) / (hi - lo) in float32.
 *
 * Non-finite w or imatrix, negative imatrix, empty shapes, bad kinds: an error
 * status with a message naming the element. Never an abort.
 */
#ifndef ORK_QUANT_H
#define ORK_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "cpu.h"
#include "status.h"

/* A kind is its row index in the registry; the built-in rows have fixed ids
 * (the O4N1/O8N1 header stores the id, docs/o4n1.md). */
typedef enum ork_kind {
    ORK_KIND_NF4 = 0,
    ORK_KIND_INT4 = 1,
    ORK_KIND_INT8 = 2,
    ORK_KIND_INT5 = 3, /* uniform 5-bit: codes in [-15, 15], computed as int8 */
    ORK_KIND_INT6 = 4, /* uniform 6-bit: codes in [-31, 31], computed as int8 */
    ORK_KIND_W4A4 = 5, /* uniform 4-bit integer codes in [-7, 7] (-8 too in affine groups, affine.h) for the NPU's
                          int4 x int4 mode (act_bits 4) */
    ORK_KIND_W4A8 = 6  /* the same codes with int8 activations: two int4 digits per activation on the NPU */
} ork_kind;

#define ORK_QUANT_TINY 1e-30f /* rows with absmax below this are zero rows */
#define ORK_QUANT_MAX_DIM ((size_t)1 << 31)
#define ORK_QUANT_MAX_GRID 1024

/* Levels of a 4-bit kind, already on the int8 LUT grid, as float32. */
typedef struct ork_q4_grid {
    int nlev;       /* 16 for NF4, 15 for INT4 */
    float lev[16];  /* ascending, integer-valued: (float)lut[c] */
    float thr[15];  /* thr[i] = (lev[i] + lev[i+1]) / 2 (exact) */
    /* A lookup that finds the nearest level without the 15 comparisons, for the SIMD error kernels:
     * y clamped to [-128, 128] falls in cell c = min(trunc((y + 128) / 8), 31); every threshold below
     * the cell (minus a margin that covers the rounding of y + 128) is counted in cell_base[c], and the
     * at most two thresholds in or near it are cell_t1[c] <= cell_t2[c] (FLT_MAX when absent), so
     * #{i : y > thr[i]} = cell_base[c] + (y > cell_t1[c]) + (y > cell_t2[c]) exactly. Filled by
     * ork_q4_grid_cells; cells = 0 (a grid with three thresholds near one cell, or a grid built by hand)
     * makes the kernels count all thresholds instead. */
    int cells;
    int32_t cell_base[32];
    float cell_t1[32], cell_t2[32];
} ork_q4_grid;

/* Fill the cell lookup of g from g->nlev and g->thr (cells = 0 when it cannot be exact). */
void ork_q4_grid_cells(ork_q4_grid *g);

/* ------------------------------------------------------ kind registry -- */
#define ORK_KIND_MAX 8       /* rows, built-in + registered */
#define ORK_KIND_NAME_MAX 16 /* name bytes, NUL included */

typedef struct ork_kind_info {
    ork_kind id;                  /* row index; the O4N1/O8N1 header's kind field */
    char name[ORK_KIND_NAME_MAX]; /* "nf4", "int4", "int8" */
    int bits;                     /* 4: 4-bit codes into lut, two per byte; 8: int8 codes */
    int nlev;                     /* 4-bit: number of levels (2..16); 8-bit: 0 */
    float levels[16];             /* 4-bit: nominal levels, ascending, in [-1, 1] */
    int qmax;                     /* 8-bit: the largest |code|, 2^(store_bits-1) - 1 (127, 31, 15); 4-bit: 127 */
    int store_bits;               /* bits per code in a file (docs/o4n1.md): 4, or 8 / 6 / 5 / 4 for 8-bit kinds */
    int act_bits;                 /* the activation width its linears multiply (8; 4: w4a4, the NPU's int4 x int4
                                     mode, docs/w4a4.md); 0 in a row means 8 (ork_kind_derive) */
    /* derived from levels (ork_kind_derive), never written by hand: */
    int8_t lut[16];               /* 4-bit: round_half_away(levels[c] * 127), 0 for c >= nlev */
    uint8_t zero_code;            /* 4-bit: the code of level 0.0 (zero rows, padding nibbles) */
    ork_q4_grid grid;             /* 4-bit: lev[c] = lut[c], thr = midpoints */
} ork_kind_info;

/* The smallest code an 8-bit kind stores: -(qmax + 1) for the kinds the NPU's int4 mode multiplies
 * (store_bits 4: w4a4 and w4a8, whose 4-bit two's-complement codes reach -8; the symmetric quantizers
 * stay in [-qmax, qmax], affine groups use -8, affine.h), else -qmax. */
static inline int ork_kind_qmin(const ork_kind_info *ki) {
    return ki->bits == 8 && ki->store_bits == 4 ? -(ki->qmax + 1) : -ki->qmax;
}

/* The row of a kind, or NULL when no row has that id. */
const ork_kind_info *ork_kind_get(ork_kind kind);
/* The row named `name`, or NULL. */
const ork_kind_info *ork_kind_find(const char *name);
/* Rows in the registry (ids 0 .. count-1). */
size_t ork_kind_count(void);
/* ORK_EINVAL "unknown quantization kind %d" unless a row has that id. */
ork_status ork_kind_check(ork_kind kind, ork_err *err);
/* Fill lut, zero_code and grid of a 4-bit row from its levels after checking
 * them (ascending, finite, in [-1, 1], an exact 0.0 level, distinct LUT
 * values): the one place the registry's rules live. ORK_EINVAL naming the
 * problem. 8-bit rows: everything derived is 0. */
ork_status ork_kind_derive(ork_kind_info *row, ork_err *err);
/* TESTS ONLY: append a 4-bit codebook row (name [a-z0-9_], nlev levels);
 * ORK_EINVAL if the name is taken, the levels break a rule of
 * ork_kind_derive, the table is full or the registry is sealed. The product
 * never registers kinds; tests use it to prove a new kind needs only a row. */
ork_status ork_kind_register(const char *name, const float *levels, int nlev, ork_kind *id, ork_err *err);
/* Close the registry for ork_kind_register: called when the table is
 * exported (the binding's kinds()), so derived lists can never go stale. */
void ork_kind_seal(void);

/* ------------------------------------------------------ per-ISA kernels -- */
/* Each ISA file (quant_ref.c, quant_avx2.c, quant_neon.c) fills one table.
 * The _ref table is the oracle; every other table must be bit-identical. */
#define ORK_WERR_BATCH 4 /* candidates per werr4n / werr8n call */
/* screened clip search: histogram bins over [-a, a] for every segment (1024 bins lost the full search's
 * best on one row of SmolLM2's 1536-wide ffn_down by 2e-4 of the whole model's weighted error) */
#define ORK_SCREEN_BINS 2048
#define ORK_SCREEN_MIN_N 512 /* ... for segments of at least this many values */
#define ORK_SCREEN_TOP 3     /* ... estimates evaluated exactly (with 1.0: one werr4n call) */
#define ORK_SCREEN_BLOCK 8   /* ... bins per block of the two-level prefix sums */
#define ORK_PRUNE_MIN_N 128  /* pruned full search (8-bit kinds): segments of at least this many values */
#define ORK_PRUNE_TAIL 512   /* ... the lower bound's tail holds at most this many values */
#define ORK_PRUNE_TAU 0.7f   /* ... of those with |x| >= ORK_PRUNE_TAU * absmax */
#if ORK_SCREEN_TOP + 1 > ORK_WERR_BATCH
#error "the screened search's exact candidates must fit one werr4n batch"
#endif

typedef struct ork_quant_kernels {
    const char *isa;
    /* *amax = max |x[k]|. Returns 1 if any x is NaN/Inf (then *amax is
     * unspecified), else 0. */
    int (*absmax)(const float *x, size_t n, float *amax);
    /* codes[k] = #{i < nlev-1 : x[k]*inv > g->thr[i]} */
    void (*codes4_rtn)(const float *x, size_t n, float inv, const ork_q4_grid *g, uint8_t *codes);
    /* stochastic rounding between bracketing levels (see contract) */
    void (*codes4_sr)(const float *x, size_t n, float inv, const ork_q4_grid *g, uint32_t row_key,
                      uint32_t col0, uint8_t *codes);
    /* weighted squared error of nearest rounding at scale s (see contract) */
    double (*werr4)(const float *x, const float *im, size_t n, float inv, float s,
                    const ork_q4_grid *g);
    /* 8-bit kinds: lim = (float)qmax; codes clamped to [-lim, lim] */
    void (*codes8_rtn)(const float *x, size_t n, float inv, float lim, int8_t *codes);
    void (*codes8_sr)(const float *x, size_t n, float inv, float lim, uint32_t row_key, uint32_t col0,
                      int8_t *codes);
    double (*werr8)(const float *x, const float *im, size_t n, float inv, float s, float lim);
    /* The clip search's batch form: err[c] = werr4(x, im, n, inv[c], s[c], g) (werr8 with lim) for
     * c < nc, 1 <= nc <= ORK_WERR_BATCH, each bit for bit the single-candidate value. Evaluating
     * several ratios in one pass over x and im keeps independent sums in flight. */
    void (*werr4n)(const float *x, const float *im, size_t n, const float *inv, const float *s, int nc,
                   const ork_q4_grid *g, double *err);
    void (*werr8n)(const float *x, const float *im, size_t n, const float *inv, const float *s, int nc,
                   float lim, double *err);
    /* out[k] = (float)lut[nibble k] * s, nibbles packed low-first */
    void (*dequant4)(const uint8_t *packed, size_t n, const int8_t lut[16], float s, float *out);
    void (*dequant8)(const int8_t *codes, size_t n, float s, float *out);
    /* The screened search's estimates (contract above) of nc candidates (s[c], inv[c]) from the
     * prefix pairs: bins below i = off[2q..2q+1] + run[2(i-1)..2(i-1)+1], q = (i-1) / ORK_SCREEN_BLOCK,
     * both arrays with a zero pair before their first (index -2 and -1) for i = 0; B bins.
     * est[c] is quant_scalar.h ork_screen_est1's value bit for bit. */
    void (*screen_est)(const ork_q4_grid *g, const double *run, const double *off, const float *s,
                       const float *inv, size_t nc, double ra, size_t B, double *est);
    /* The screen's bin of each value (contract above): bi[k] = clamp(trunc(((double)x[k] * ra + 1) * h),
     * 0, B - 1), every operation in double, for |x[k] * ra| <= 1 + 2^-20 (x within the segment's absmax) */
    void (*screen_bins)(const float *x, size_t n, double ra, double h, int32_t B, int32_t *bi);
} ork_quant_kernels;

extern const ork_quant_kernels ork_quant_kernels_ref;
#if defined(__x86_64__) || defined(__i386__)
extern const ork_quant_kernels ork_quant_kernels_avx2;
/* AVX2's table with AVX-512 (F/VL/BW/DQ) error kernels for the clip search; picked for the
 * AVX2 ISA when the CPU has them (ORKPY_NO_AVX512=1 keeps the plain AVX2 table). */
extern const ork_quant_kernels ork_quant_kernels_avx512;
#endif
#if defined(__aarch64__)
extern const ork_quant_kernels ork_quant_kernels_neon;
#endif
/* the quantizer table of an ISA (quant_ref.c picks it): for avx2, the AVX-512 one where
 * ork_cpu_use_avx512(); NULL when this build has no kernels for the ISA */
const ork_quant_kernels *ork_quant_kernels_for(ork_isa isa);
const ork_quant_kernels *ork_quant_kernels_active(void); /* of ork_cpu_isa() */

/* ---------------------------------------------------- shared definitions -- */
static inline uint32_t ork_mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}
static inline uint32_t ork_sr_row_key(uint64_t seed, uint64_t row) {
    uint32_t k = ork_mix32((uint32_t)seed ^ 0x9e3779b9U);
    k = ork_mix32(k ^ (uint32_t)(seed >> 32));
    k = ork_mix32(k ^ (uint32_t)row);
    return ork_mix32(k ^ (uint32_t)(row >> 32) ^ 0x85ebca6bU);
}
/* per-element hash; SIMD variants compute the same 32-bit arithmetic */
static inline uint32_t ork_sr_hash(uint32_t row_key, uint32_t col) {
    return ork_mix32(row_key + col * 0x9e3779b1U);
}
#define ORK_SR_UNIT (1.0f / 16777216.0f) /* 2^-24 */

/* --------------------------------------------------------- driver API -- */
typedef struct ork_quant_params {
    ork_kind kind;
    const float *imatrix; /* nullable, (K,) */
    const float *grid;    /* nullable -> ork_quant_default_grid */
    size_t ngrid;
    int sr;
    uint64_t seed;
    int nthreads; /* <= 0: all cores */
    size_t group; /* 0: one scale per row; else a multiple of 32 (ork_group_check): one per group */
    int full_search; /* 1: the imatrix clip search evaluates every grid ratio (no screen) */
} ork_quant_params;

/* Group-wise scales (group = g > 0): row n's columns [i*g, min(K, (i+1)*g)) are a
 * segment with its own scale scales[n * G + i], G = ceil(K / g) (row-major N x G),
 * quantized exactly as a row of that many columns is (absmax, the imatrix clip
 * search over the segment's imatrix entries, its codes at the same place of the
 * row; stochastic rounding hashes the row's global column index). group == 0 or
 * group >= K is one segment per row: the per-row contract above, byte for byte.
 * The codes' layout does not change (4-bit segments start on even columns).
 *
 * float16 group scales (more than one segment per row, 0 < group < K; O4N1/O8N1
 * version 3 stores them as float16, docs/o4n1.md): a segment's scale is a float16
 * value. For m = a * r,
 *     s = f16(m / 127)   (m / 127 in float32 as above, then to the nearest float16,
 *                         ties to even: half.h ork_f16_from_f32)
 *     inv = 1 / s        (float32 division; y = w * inv as above)
 * so the codes are the nearest levels of w / s for the scale actually stored (the
 * dequantization error is that of s, not of m / 127; a y beyond the end level
 * takes it, as in the per-row contract). The imatrix search evaluates every
 * candidate r with its (s, inv), so E(r) is the error of what would be stored.
 *   - Subnormal float16 scales (m / 127 < 2^-14: absmax below ~7.8e-3 at r = 1)
 *     are kept (gradual underflow, as llama.cpp's fp16 block scales): the stored
 *     s is within 2^-25 of m / 127, a weight's error grows by at most
 *     127 * 2^-25 ~ 3.8e-6.
 *   - A candidate whose s rounds to 0 (m / 127 <= 2^-25) is evaluated as all
 *     zeros (inv = 0); when the search picks it, or r = 1 already gives s = 0
 *     (absmax below ~3.8e-6), the segment is a zero segment: s = 0, zero codes.
 *   - A segment with absmax a >= ORK_QUANT_TINY whose f16(a / 127) overflows
 *     (a / 127 >= 65520, absmax >= ~8.32e6) is an error, ORK_EINVAL naming the
 *     row, the group and the absmax: no float16 scale reaches it, and
 *     saturating would silently clip the segment (a smaller clip ratio is never
 *     tried instead). Such a weight needs per-row scales (group 0) or rescaling.
 * Per-row scales (group 0 or >= K) stay float32, byte for byte. */
#define ORK_GROUP_MAX 4096
/* ORK_EINVAL unless group is 0 or a multiple of 32 in [32, ORK_GROUP_MAX]. */
ork_status ork_group_check(size_t group, ork_err *err);
/* G = ceil(K / group) scales per row (1 for group 0). */
size_t ork_group_count(size_t K, size_t group);

/* Bytes of one quantized row: ceil(K/2) for 4-bit kinds, K for int8; 0 for unknown kinds. */
size_t ork_quant_row_bytes(ork_kind kind, size_t K);
/* The kind's int8 LUT (16 entries) or NULL for 8-bit / unknown kinds. */
const int8_t *ork_quant_lut(ork_kind kind);
/* Default clip-ratio grid: 1.00, 0.99, ..., 0.60 (ORK_QUANT_DEFAULT_GRID_N
 * ratios, r_i = (100 - i) / 100 in float32). Writes min(cap, n) ratios and
 * returns n. */
#define ORK_QUANT_DEFAULT_GRID_N 41
size_t ork_quant_default_grid(float *out, size_t cap);

/* codes: N * ork_quant_row_bytes(kind, K) bytes; scales: N * ork_group_count(K, p->group) floats. */
ork_status ork_quantize(const float *w, size_t N, size_t K, const ork_quant_params *p,
                        void *codes, float *scales, ork_err *err);
/* ork_quantize of a weight stored as ggml type w_type: ORK_GGML_F32 (that is ork_quantize), ORK_GGML_F16
 * or ORK_GGML_BF16, row n at w + n * K * (element size). Each row is converted to float32 by
 * ork_dequant_row (exact: every float16 / bfloat16 value is a float32 value) into a buffer of the worker
 * that quantizes it (on its stack up to K = 8192), so the codes and scales are byte for byte ork_quantize's of the converted weight,
 * with no float32 copy of the whole weight and the conversion spread over the threads. A non-finite
 * value is ORK_ENONFINITE naming it as ork_quantize does; another w_type is ORK_EINVAL. */
ork_status ork_quantize_typed(const void *w, uint32_t w_type, size_t N, size_t K, const ork_quant_params *p,
                              void *codes, float *scales, ork_err *err);
ork_status ork_dequantize(ork_kind kind, const void *codes, const float *scales, size_t N,
                          size_t K, size_t group, float *out, int nthreads, ork_err *err);

/* One segment's scale, as ork_quantize picks it, for GPTQ (gptq.h), which rounds each
 * column itself: the n values x at columns [col0, col0 + n) of row `row` of a weight with K
 * columns quantized with p (kind; imatrix (K,) or NULL, not checked here; grid; group:
 * float16 scales when 0 < group < K; sr ignored). *scale: the stored scale; *inv: the float32
 * inverse its codes are chosen with (y = w * inv; 0 for a zero segment).
 * ORK_ENONFINITE naming [row, col] for a non-finite x, ORK_EINVAL for a float16 overflow. */
ork_status ork_quant_segment_scale(const ork_quant_params *p, size_t K, size_t row, size_t col0, const float *x,
                                   size_t n, float *scale, float *inv, ork_err *err);

#endif /* ORK_QUANT_H */
