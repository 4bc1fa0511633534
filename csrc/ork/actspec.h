/* actspec.h - the activation spec of a packed linear (how its float input
 * becomes int8) and the registry of activation modes: one value from the API
 * (orkpy.ActSpec) through the binding (csrc/py/coerce.c
 * orkpy_act_spec_from_py) to the kernels (linear.c, pack.c, ffn_chain.c).
 * (act.h is another thing: the FFN's gate activation, SiLU / GELU.)
 *
 * ------------------------------------------------------------- the spec --
 *   ork_act_spec { mode, bits, clip, prefix, outliers, n_outliers, search, digits, group }
 *   mode        a registry row id (below); 0 is per_token
 *   bits        activation bits: one of the widths the mode's row serves
 *               (its `bits` mask: ork_act_bits_ok): 8 (codes in [-127, 127])
 *               or 4 (codes in [-7, 7], [-8, 7] when searched, the NPU's int4 x int4 mode, a w4a4
 *               linear's: docs/w4a4.md); the codes are int8 either way
 *   clip        a static mode's range (> 0, float32, calibrated once); 0 for
 *               every other mode
 *   prefix      the first `prefix` rows of every call are quantized per row
 *               at 8 bits whatever the mode and width (and left out of the
 *               rows the mode's range sees); the forward pass passes
 *               positions, so these are the sequence's first positions
 *               (linear.h "prefix"): the attention sink, whose massive
 *               activations no 4-bit grid serves, stays int8 in a w4a4
 *               linear, its codes stopping at +-ORK_ACT_DIGITS_QMAX = 119
 *               at 4 bits (as with digits, below), so that the NPU's int4
 *               mode runs the row as two int4 digit rows (npu/device.h)
 *   outliers    n_outliers input channels (strictly increasing, < K) kept out
 *               of the int8 product and added in float (linear.h "outliers");
 *               allowed with every mode
 *   search      0: a row's range is the mode's; 1 (modes whose rows each have
 *               their own range, i.e. neither STATIC nor PER_TENSOR; bits < 8):
 *               each non-prefix row's range is searched to minimise its own
 *               squared quantization error: candidates c_i = a * (1 - i/40),
 *               i = 0..ORK_ACT_SEARCH_N-1 (a the mode's range), each scored as
 *               sum_k (double)(x - q*s)^2 with the quantizer's codes q and step
 *               s = sg * (c / qmax) (float32, the sum in k order); the first
 *               strictly smaller error replaces the best, so ties keep the larger
 *               range and the result is never worse than absmax; every ISA
 *               chooses the same range. A searched row's codes take one more
 *               level, [-qmax - 1, qmax] (at 4 bits [-8, 7], the int4 mode's whole
 *               range): sg = -1 when the row's first largest |x| is positive,
 *               else 1, so the extra code lies on the extreme's side, and q =
 *               clamp(round_half_away(x * (sg * (qmax / c))), -qmax - 1, qmax)
 *               (the codes8_rtn kernel at limit qmax + 1, bit-exact on every ISA,
 *               then the top code lowered to qmax); the row's scale is the
 *               signed step s. Each candidate's levels are the [-qmax, qmax]
 *               grid's plus one, so the error never exceeds the symmetric rule's.
 *   digits      1 (bits 8 only): the codes stop at +-ORK_ACT_DIGITS_QMAX = 119
 *               (step range / 119), so each splits into two int4 digits
 *               x = 16 h + l, h, l in [-8, 7] (16 * 7 + 7 = 119): a w4a8
 *               linear's activations, two rows of the NPU's int4 mode
 *               (quant.h, docs/w4a4.md); prefix rows too
 *   group       0: one scale per row (everything above). g > 0 (a multiple of
 *               32, quant.h ork_group_check; per-row modes only, neither
 *               STATIC nor PER_TENSOR): one scale per row and group of g
 *               inputs, G = ceil(ldq / g) groups (padding inputs belong to the
 *               last): every rule above applies to each (row, group) segment
 *               as if it were a row of g inputs (zero-padded past K), the
 *               prefix rows' segments included (the mode's range kernel sees
 *               the segments as rows); ascale holds G x M entries, group-major
 *               (ascale[i * M + m], row m, group i). A linear takes it only
 *               with a weight grouped alike (linear.h): each group is one
 *               int4 K tile of the NPU whose int16 block the host scales, so
 *               a scale per (token, group) costs the NPU nothing
 * ork_act_spec_check is the one validator (ORK_EINVAL naming the problem);
 * ORK_ACT_SPEC_INIT is the per-token default.
 *
 * ------------------------------------------------------------- a mode ----
 * A mode is one row of the registry (actspec.c, g_modes):
 *   name        what the API, the CLI (--act) and the files call it
 *   flags       ORK_ACTF_STATIC     needs a calibrated static range (clip > 0);
 *                                   the calibration's prefix is its default
 *               ORK_ACTF_PER_TENSOR one dynamic range spans a call's rows
 *               ORK_ACTF_OUTLIERS   takes outlier channels from the calibration
 *               (STATIC or PER_TENSOR: rows share a range, so a prefix applies)
 *   range       the mode's kernel: the range (the value mapped to +-127) of
 *               each non-prefix row, from the rows, their absmax and the spec
 *   bits        the activation widths it serves, ORK_ACT_BITS_MASK(b) for
 *               each width b (the built-in rows and a registered one: 8)
 * The quantizer (ork_quantize_acts) is shared: a row with range a >=
 * ORK_QUANT_TINY has scale a / 127 and codes clamp(round_half_away(x * (127 /
 * a)), -127, 127) (the kind quantizer's codes8_rtn, so values beyond +-a
 * saturate); a smaller range is a zero row (scale 0, codes 0). Prefix rows take
 * their own absmax. Non-finite inputs are ORK_ENONFINITE naming them.
 *
 * Built-in rows: per_token (range = the row's absmax), per_tensor (the largest
 * absmax of the call's non-prefix rows), static (clip), per_token_outliers
 * (per_token's range; the calibration's outlier channels). Their ids are the
 * ORK_ACT_MODE_* constants.
 *
 * ----------------------------------------------------- adding a mode -----
 * Product files (at most 3; tests aside):
 *   1. csrc/ork/actspec.c   its kernel (an ork_act_range_fn) and its row at the
 *                           end of g_modes (id = its index; files and the API
 *                           use names; ORK_ACT_MODE_MAX bounds the table)
 *   2. orkpy/runtime/actcal.py  a line in the module doc (the modes' user
 *                           documentation); its calibration only when it needs
 *                           one that does not exist yet (a static range and
 *                           outlier channels exist: ORK_ACTF_STATIC /
 *                           ORK_ACTF_OUTLIERS take them from an ActCalibration)
 *   3. csrc/ork/actspec.h   an ORK_ACT_MODE_* constant, only if C code must name
 *                           the mode
 * Everything else reads the row: _core.act_modes(), orkpy.ACT_MODES, ActSpec's
 * checks and its resolution from a calibration, load_model / QuantizedModel,
 * PackedWeight.matmul, the CLI's --act choices, the forward pass, the decode
 * session, the NPU path (the int8 matmul is the same) and the FFN chain (its
 * input is quantized in the gate's spec). tests/test_act_registry.py registers
 * a dummy mode through _core._register_act_mode_for_tests and runs it there.
 */
#ifndef ORK_ACTSPEC_H
#define ORK_ACTSPEC_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define ORK_ACT_MODE_MAX 8       /* rows, built-in + registered */
#define ORK_ACT_MODE_NAME_MAX 24 /* name bytes, NUL included */
#define ORK_ACT_BITS 8           /* the default width (a registered row serves it) */
#define ORK_ACT_SEARCH_N 20      /* range candidates of a searched row: 1.0 .. 0.525 of its range */
#define ORK_ACT_BITS_MASK(b) (1u << ((b) - 1)) /* width b (1..32) in a row's bits mask */

enum {
    ORK_ACT_MODE_PER_TOKEN = 0,
    ORK_ACT_MODE_PER_TENSOR = 1,
    ORK_ACT_MODE_STATIC = 2,
    ORK_ACT_MODE_PER_TOKEN_OUTLIERS = 3,
};

#define ORK_ACTF_STATIC 1u
#define ORK_ACTF_PER_TENSOR 2u
#define ORK_ACTF_OUTLIERS 4u

typedef struct ork_act_spec {
    int mode;                /* registry row id */
    int bits;                /* 8 */
    float clip;              /* static range, 0 = dynamic */
    size_t prefix;           /* leading rows quantized per row */
    const int32_t *outliers; /* n_outliers channels computed in float, strictly increasing, < K */
    size_t n_outliers;
    int search;              /* 1: per-row range search (bits < 8, per-row modes), see above */
    int digits;              /* 1: int8 codes in [-119, 119], two int4 digits each (bits 8), see above */
    size_t group;            /* 0: a scale per row; g: a scale per row and group of g inputs, see above */
} ork_act_spec;

#define ORK_ACT_DIGITS_QMAX 119 /* 16 * 7 + 7: the largest code two int4 digits make symmetrically */
#define ORK_ACT_SPEC_INIT {ORK_ACT_MODE_PER_TOKEN, ORK_ACT_BITS, 0.0f, 0, NULL, 0, 0, 0, 0}

/* A mode's kernel: r[0..M) holds the absmax (finite) of rows x[0..M) (stride K) on
 * entry and their ranges on return. The prefix rows are not among them. */
typedef ork_status (*ork_act_range_fn)(const ork_act_spec *spec, const float *x, size_t M, size_t K, float *r,
                                       ork_err *err);

typedef struct ork_act_mode_info {
    int id;                           /* row index */
    char name[ORK_ACT_MODE_NAME_MAX]; /* "per_token", ... */
    unsigned flags;                   /* ORK_ACTF_* */
    ork_act_range_fn range;
    uint32_t bits;                    /* the widths it serves: ORK_ACT_BITS_MASK(b) for each */
} ork_act_mode_info;

/* The row of a mode id, or NULL. */
const ork_act_mode_info *ork_act_mode_get(int mode);
/* The row named `name`, or NULL. */
const ork_act_mode_info *ork_act_mode_find(const char *name);
/* Rows in the registry (ids 0 .. count-1). */
size_t ork_act_mode_count(void);
/* Whether a mode serves `bits`-bit activations (its row's bits mask: 4 and 8 for the built-in rows). */
int ork_act_bits_ok(const ork_act_mode_info *row, int bits);
/* TESTS ONLY: append a row (name [a-z0-9_], flags, kernel; serving ORK_ACT_BITS); ORK_EINVAL if the
 * name is taken, the flags are unknown, the kernel is NULL, the table is full
 * or the registry is sealed. The product never registers modes; tests use it
 * to prove a new mode needs only a row and its kernel. */
ork_status ork_act_mode_register(const char *name, unsigned flags, ork_act_range_fn range, int *id, ork_err *err);
/* Close the registry: called when the table is exported (the binding's act_modes()). */
void ork_act_mode_seal(void);

/* The one validator of a spec for K inputs: a registered mode that serves
 * spec->bits; clip a valid range (ork_act_clip_check) for a static mode and 0
 * for any other; outliers strictly increasing in [0, K) (NULL only when
 * n_outliers is 0). ORK_EINVAL naming the problem. */
ork_status ork_act_spec_check(const ork_act_spec *spec, size_t K, ork_err *err);
/* A static range: ORK_EINVAL unless finite and >= ORK_QUANT_TINY. */
ork_status ork_act_clip_check(float clip, ork_err *err);

/* Quantize activations in a spec's mode (see above): x (M, K) -> xq (M rows of
 * ldq >= K int8, zero-padded) and ascale (M; with group g: G x M, G =
 * ork_act_groups(spec, ldq)). The outlier channels are the caller's (linear.c
 * zeroes them first). Checks the spec. */
size_t ork_act_groups(const ork_act_spec *spec, size_t ldq); /* scales per row: 1, or ceil(ldq / group) */
ork_status ork_quantize_acts(const float *x, size_t M, size_t K, size_t ldq, const ork_act_spec *spec, int8_t *xq,
                             float *ascale, ork_err *err);

#endif
