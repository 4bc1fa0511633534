/* plan.c - see plan.h. */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "../pack.h"
#include "regcmd.h"

static uint64_t align_up(uint64_t x) { return (x + ORK_NPU_ALIGN - 1) & ~(uint64_t)(ORK_NPU_ALIGN - 1); }

/* size of tile i when `units` units are split into n near-equal tiles */
static uint32_t split_size(uint32_t units, uint32_t n, uint32_t i) { return units / n + (i < units % n ? 1u : 0u); }
static uint32_t split_start(uint32_t units, uint32_t n, uint32_t i) {
    uint32_t q = units / n, r = units % n;
    return i * q + (i < r ? i : r);
}

/* K tile ki of KB blocks in nk tiles: near-equal, or with gb > 0 blocks per group exactly gb (the last the rest) */
static uint32_t k_size(uint32_t KB, uint32_t nk, uint32_t gb, uint32_t ki) {
    return gb ? (ki + 1 < nk ? gb : KB - gb * (nk - 1)) : split_size(KB, nk, ki);
}
static uint32_t k_start(uint32_t KB, uint32_t nk, uint32_t gb, uint32_t ki) { return gb ? gb * ki : split_start(KB, nk, ki); }

void ork_npu_plan_free(ork_npu_plan *p) {
    if (!p) return;
    free(p->tasks);
    p->tasks = NULL;
    p->n_tasks = 0;
}

ork_status ork_npu_plan_make(uint32_t M, uint32_t K, uint32_t N, const ork_npu_plan_opts *opts, ork_npu_plan *p,
                             ork_err *err) {
    if (!p) return ork_err_set(err, ORK_EINVAL, "npu plan: NULL output");
    memset(p, 0, sizeof *p);
    if (M == 0 || K == 0 || N == 0) return ork_err_set(err, ORK_EINVAL, "npu matmul %ux%ux%u: empty dimension", M, K, N);
    if (K > ORK_NPU_MAX_K)
        return ork_err_set(err, ORK_EINVAL, "npu matmul: K = %u exceeds %u (the int32 sum of K tiles must stay exact)", K,
                           ORK_NPU_MAX_K);
    if (N > ORK_NPU_MAX_N || M > ORK_NPU_MAX_TOTAL_M)
        return ork_err_set(err, ORK_EINVAL, "npu matmul: M = %u or N = %u is too large for one plan", M, N);
    const ork_npu_precision prec = opts ? opts->precision : ORK_NPU_PREC_INT8;
    if (prec != ORK_NPU_PREC_INT8 && prec != ORK_NPU_PREC_INT4)
        return ork_err_set(err, ORK_EINVAL, "npu plan: unknown precision %d", (int)prec);
    const int i4 = prec == ORK_NPU_PREC_INT4;
    /* N unit: int8 kernels come in groups of 32, int4 in groups of 64 (RKNN's native B layouts) */
    const uint32_t nu = i4 ? 64u : 32u, bits = i4 ? 4u : 8u;
    uint32_t max_m = ORK_NPU_MAX_M, max_k = i4 ? ORK_NPU_INT4_MAX_KT : ORK_NPU_MAX_KT, max_n = ORK_NPU_MAX_NT;
    if (opts) {
        if (opts->max_m) max_m = opts->max_m < max_m ? opts->max_m : max_m;
        if (opts->max_k) max_k = opts->max_k < max_k ? opts->max_k : max_k;
        if (opts->max_n) max_n = opts->max_n < max_n ? opts->max_n : max_n;
    }
    max_m &= ~3u;
    max_k &= ~31u;
    max_n -= max_n % nu;
    if (max_m < 4 || max_k < 32 || max_n < nu)
        return ork_err_set(err, ORK_EINVAL, "npu plan: tile caps must be at least M 4, K 32, N %u", nu);
    const uint32_t group = opts ? opts->group : 0;
    if (group && (group % 32 || group > max_k))
        return ork_err_set(err, ORK_EINVAL, "npu plan: group size %u must be a multiple of 32 of at most the K tile %u",
                           group, max_k);
    const uint32_t Kp = (K + 31u) & ~31u, Np = (N + nu - 1) / nu * nu;
    const uint32_t KB = Kp / 32, NB = Np / nu, gb = group / 32;
    const uint32_t nk = group ? (KB + gb - 1) / gb : (Kp + max_k - 1) / max_k, nn = (Np + max_n - 1) / max_n;
    const uint32_t kt_max = k_size(KB, nk, gb, 0) * 32;
    uint32_t nm, G = 0;
    if (M == 1) {
        nm = 1;
    } else {
        uint32_t cap = (uint32_t)((uint64_t)ORK_NPU_FEATURE_BYTES * 8 / ((uint64_t)kt_max * bits)); /* CBUF in bytes */
        if (cap > max_m) cap = max_m;
        cap &= ~3u;
        if (cap < 4) return ork_err_set(err, ORK_EINVAL, "npu plan: no M tile fits the feature banks");
        G = (M + 3) / 4;
        nm = (G * 4 + cap - 1) / cap;
    }
    uint64_t nt64 = (uint64_t)nm * nk * nn;
    if (nt64 > (1u << 20)) return ork_err_set(err, ORK_EINVAL, "npu plan: %llu tasks is too many", (unsigned long long)nt64);
    p->tasks = (ork_npu_task_desc *)calloc((size_t)nt64, sizeof *p->tasks);
    if (!p->tasks) return ork_err_set(err, ORK_ENOMEM, "npu plan: out of memory for %llu tasks", (unsigned long long)nt64);
    p->prec = prec;
    p->bits = bits;
    p->out_esz = i4 ? 2u : 4u;
    p->M = M;
    p->K = K;
    p->N = N;
    p->Kp = Kp;
    p->Np = Np;
    p->nm = nm;
    p->nk = nk;
    p->group = group;
    p->nn = nn;
    p->n_tasks = (uint32_t)nt64;
    /* input blocks (mi, ki), weight blocks (ni, ki); bytes = codes * bits / 8 */
    uint64_t in_off = 0, w_off = 0, out_off = 0;
    uint64_t *in_at = (uint64_t *)calloc((size_t)nm * nk, sizeof(uint64_t));
    uint64_t *w_at = (uint64_t *)calloc((size_t)nn * nk, sizeof(uint64_t));
    if (!in_at || !w_at) {
        free(in_at);
        free(w_at);
        ork_npu_plan_free(p);
        return ork_err_set(err, ORK_ENOMEM, "npu plan: out of memory");
    }
    for (uint32_t mi = 0; mi < nm; mi++) {
        uint32_t Mp = M == 1 ? 1 : split_size(G, nm, mi) * 4;
        for (uint32_t ki = 0; ki < nk; ki++) {
            in_at[(size_t)mi * nk + ki] = in_off;
            in_off = align_up(in_off + (uint64_t)Mp * k_size(KB, nk, gb, ki) * 32 * bits / 8);
        }
    }
    for (uint32_t ni = 0; ni < nn; ni++)
        for (uint32_t ki = 0; ki < nk; ki++) {
            w_at[(size_t)ni * nk + ki] = w_off;
            w_off = align_up(w_off + (uint64_t)split_size(NB, nn, ni) * nu * k_size(KB, nk, gb, ki) * 32 * bits / 8);
        }
    size_t t = 0;
    for (uint32_t mi = 0; mi < nm; mi++) {
        uint32_t m0 = M == 1 ? 0 : split_start(G, nm, mi) * 4;
        uint32_t Mp = M == 1 ? 1 : split_size(G, nm, mi) * 4;
        uint32_t Mt = M - m0 < Mp ? M - m0 : Mp;
        for (uint32_t ni = 0; ni < nn; ni++)
            for (uint32_t ki = 0; ki < nk; ki++, t++) {
                ork_npu_task_desc *d = &p->tasks[t];
                d->m0 = m0;
                d->Mt = Mt;
                d->Mp = Mp;
                d->k0 = k_start(KB, nk, gb, ki) * 32;
                d->Kt = k_size(KB, nk, gb, ki) * 32;
                d->n0 = split_start(NB, nn, ni) * nu;
                d->Nt = split_size(NB, nn, ni) * nu;
                d->mi = mi;
                d->ki = ki;
                d->ni = ni;
                d->in_off = in_at[(size_t)mi * nk + ki];
                d->w_off = w_at[(size_t)ni * nk + ki];
                d->out_off = out_off;
                out_off = align_up(out_off + (uint64_t)Mp * d->Nt * p->out_esz);
                d->cmd_off = (uint64_t)t * ORK_NPU_TASK_QWORDS * 8;
                p->macs += (uint64_t)Mp * d->Kt * d->Nt;
            }
    }
    free(in_at);
    free(w_at);
    p->in_bytes = in_off;
    p->w_bytes = w_off;
    p->out_bytes = out_off;
    p->cmd_bytes = (uint64_t)p->n_tasks * ORK_NPU_TASK_QWORDS * 8;
    return ORK_OK;
}

static ork_status check_region(const char *what, uint32_t addr, uint64_t bytes, ork_err *err) {
    if (addr % ORK_NPU_ALIGN)
        return ork_err_set(err, ORK_EINVAL, "npu %s buffer address 0x%08x is not %u-byte aligned", what, addr,
                           ORK_NPU_ALIGN);
    if ((uint64_t)addr + bytes > ((uint64_t)1 << 32))
        return ork_err_set(err, ORK_EINVAL, "npu %s buffer (0x%08x + %llu bytes) does not fit the 32-bit NPU address space",
                           what, addr, (unsigned long long)bytes);
    return ORK_OK;
}

ork_status ork_npu_plan_emit(const ork_npu_plan *p, uint32_t cmd_addr, uint32_t in_addr, uint32_t w_addr,
                             uint32_t out_addr, uint64_t *cmds, ork_err *err) {
    if (!p || !p->tasks || !cmds) return ork_err_set(err, ORK_EINVAL, "npu emit: NULL argument");
    ork_status st;
    if ((st = check_region("regcmd", cmd_addr, p->cmd_bytes, err)) || (st = check_region("input", in_addr, p->in_bytes, err)) ||
        (st = check_region("weight", w_addr, p->w_bytes, err)) || (st = check_region("output", out_addr, p->out_bytes, err)))
        return st;
    for (uint32_t t = 0; t < p->n_tasks; t++) {
        const ork_npu_task_desc *d = &p->tasks[t];
        ork_npu_matmul_desc m = {p->prec == ORK_NPU_PREC_INT4 ? ORK_NPU_INT4_INT16 : ORK_NPU_INT8_INT32,
                                 d->Mp, d->Kt, d->Nt, in_addr + (uint32_t)d->in_off, w_addr + (uint32_t)d->w_off,
                                 out_addr + (uint32_t)d->out_off};
        uint64_t *q = cmds + (size_t)t * ORK_NPU_TASK_QWORDS;
        if ((st = ork_npu_matmul_task(&m, q, err))) return st;
        if (t + 1 < p->n_tasks &&
            (st = ork_npu_task_tail(q + ORK_NPU_TASK_BODY, cmd_addr + (uint32_t)p->tasks[t + 1].cmd_off,
                                    ORK_NPU_TASK_BODY, err)))
            return st;
    }
    return ORK_OK;
}

/* ------------------------------------------------------------- chains --- */
/* "npu chain, matmul i of n: " before a planner / emitter message */
static ork_status chain_err(ork_err *err, ork_status st, uint32_t i, uint32_t n) {
    if (!err || n == 1) return st; /* a single matmul keeps the planner's own message */
    char msg[sizeof err->msg];
    memcpy(msg, err->msg, sizeof msg);
    msg[sizeof msg - 1] = 0;
    return ork_err_set(err, st, "npu chain, matmul %u of %u: %s", i + 1, n, msg);
}

void ork_npu_chain_free(ork_npu_chain *c) {
    if (!c) return;
    for (uint32_t i = 0; c->plans && i < c->n; i++) ork_npu_plan_free(&c->plans[i]);
    free(c->plans);
    free(c->in_at);
    memset(c, 0, sizeof *c);
}

ork_status ork_npu_chain_make(uint32_t n, const uint32_t *M, const uint32_t *K, const uint32_t *N,
                              const ork_npu_plan_opts *opts, ork_npu_chain *c, ork_err *err) {
    if (!c) return ork_err_set(err, ORK_EINVAL, "npu chain: NULL output");
    memset(c, 0, sizeof *c);
    if (n == 0 || !M || !K || !N) return ork_err_set(err, ORK_EINVAL, "npu chain: no matmuls");
    c->plans = (ork_npu_plan *)calloc(n, sizeof *c->plans);
    c->in_at = (uint64_t *)calloc((size_t)3 * n, sizeof(uint64_t));
    if (!c->plans || !c->in_at) {
        free(c->plans);
        free(c->in_at);
        c->plans = NULL;
        c->in_at = NULL;
        return ork_err_set(err, ORK_ENOMEM, "npu chain: out of memory for %u matmuls", n);
    }
    c->n = n;
    c->out_at = c->in_at + n;
    c->cmd_at = c->in_at + 2 * (size_t)n;
    uint64_t tasks = 0;
    for (uint32_t i = 0; i < n; i++) {
        ork_status st = ork_npu_plan_make(M[i], K[i], N[i], opts ? &opts[i] : NULL, &c->plans[i], err);
        if (st) {
            ork_npu_chain_free(c);
            return chain_err(err, st, i, n);
        }
        const ork_npu_plan *p = &c->plans[i];
        c->in_at[i] = c->in_bytes;
        c->out_at[i] = c->out_bytes;
        c->cmd_at[i] = c->cmd_bytes;
        c->in_bytes = align_up(c->in_bytes + p->in_bytes);
        c->out_bytes = align_up(c->out_bytes + p->out_bytes);
        c->cmd_bytes = align_up(c->cmd_bytes + p->cmd_bytes);
        tasks += p->n_tasks;
    }
    if (tasks > (1u << 20)) {
        ork_npu_chain_free(c);
        return ork_err_set(err, ORK_EINVAL, "npu chain: %llu tasks is too many", (unsigned long long)tasks);
    }
    c->n_tasks = (uint32_t)tasks;
    return ORK_OK;
}

uint32_t ork_npu_chain_task_addr(const ork_npu_chain *c, uint32_t cmd_addr, uint32_t t) {
    for (uint32_t i = 0; i < c->n; i++) {
        if (t < c->plans[i].n_tasks) return cmd_addr + (uint32_t)(c->cmd_at[i] + c->plans[i].tasks[t].cmd_off);
        t -= c->plans[i].n_tasks;
    }
    return 0;
}

ork_status ork_npu_chain_emit(const ork_npu_chain *c, uint32_t cmd_addr, uint32_t in_addr, const uint32_t *w_addr,
                              uint32_t out_addr, uint64_t *cmds, ork_err *err) {
    if (!c || !c->plans || !w_addr || !cmds) return ork_err_set(err, ORK_EINVAL, "npu chain emit: NULL argument");
    ork_status st;
    if ((st = check_region("regcmd", cmd_addr, c->cmd_bytes, err)) || (st = check_region("input", in_addr, c->in_bytes, err)) ||
        (st = check_region("output", out_addr, c->out_bytes, err)))
        return st;
    memset(cmds, 0, c->cmd_bytes);
    for (uint32_t i = 0; i < c->n; i++) {
        const ork_npu_plan *p = &c->plans[i];
        uint64_t *q = cmds + c->cmd_at[i] / 8;
        if ((st = ork_npu_plan_emit(p, cmd_addr + (uint32_t)c->cmd_at[i], in_addr + (uint32_t)c->in_at[i], w_addr[i],
                                    out_addr + (uint32_t)c->out_at[i], q, err)))
            return chain_err(err, st, i, c->n);
        /* the last task of matmul i links on to the first task of matmul i + 1 */
        if (i + 1 < c->n &&
            (st = ork_npu_task_tail(q + p->tasks[p->n_tasks - 1].cmd_off / 8 + ORK_NPU_TASK_BODY,
                                    cmd_addr + (uint32_t)c->cmd_at[i + 1], ORK_NPU_TASK_BODY, err)))
            return st;
    }
    return ORK_OK;
}

/* ------------------------------------------------------------ layouts --- */
/* int4 (plan.h, "int4"): two codes per byte, the even k in the low nibble */
static size_t in4_byte(uint32_t Mp, uint32_t m, uint32_t k) { return ((size_t)(k / 32) * Mp + m) * 16 + (k % 32) / 2; }
static size_t w4_byte(uint32_t Kt, uint32_t n, uint32_t k) {
    return (((size_t)(n / 64) * (Kt / 32) + k / 32) * 64 + n % 64) * 16 + (k % 32) / 2;
}
static void put4(uint8_t *b, size_t i, uint32_t k, int8_t v) {
    const uint8_t u = (uint8_t)v & 15u;
    b[i] = k & 1u ? (uint8_t)((b[i] & 0x0fu) | u << 4) : (uint8_t)((b[i] & 0xf0u) | u);
}
static int8_t get4(const uint8_t *b, size_t i, uint32_t k) {
    const int v = k & 1u ? b[i] >> 4 : b[i] & 15;
    return (int8_t)(v >= 8 ? v - 16 : v);
}
static ork_status bad_code(ork_err *err, const char *what, const char *ax, uint32_t row, uint32_t k, int v) {
    return ork_err_set(err, ORK_EINVAL, "npu %s: int4 code %d at (%s %u, k %u) is outside [-8, 7]", what, v, ax, row, k);
}

static size_t in_index(uint32_t Mp, uint32_t m, uint32_t k) { return ((size_t)(k / 16) * Mp + m) * 16 + k % 16; }

ork_status ork_npu_pack_input(const ork_npu_plan *p, const int8_t *A, size_t lda, uint8_t *buf, ork_err *err) {
    if (!p || !A || !buf || lda < p->K) return ork_err_set(err, ORK_EINVAL, "npu pack_input: bad arguments");
    memset(buf, 0, p->in_bytes);
    for (uint32_t t = 0; t < p->n_tasks; t++) {
        const ork_npu_task_desc *d = &p->tasks[t];
        if (d->ni) continue; /* input blocks are shared by the n tiles */
        int8_t *blk = (int8_t *)buf + d->in_off;
        uint32_t kend = d->k0 + d->Kt < p->K ? d->k0 + d->Kt : p->K;
        for (uint32_t m = 0; m < d->Mt; m++) {
            const int8_t *row = A + (size_t)(d->m0 + m) * lda;
            if (p->prec == ORK_NPU_PREC_INT4) {
                for (uint32_t k = d->k0; k < kend; k++) {
                    if (row[k] < -8 || row[k] > 7) return bad_code(err, "pack_input", "m", d->m0 + m, k, row[k]);
                    put4((uint8_t *)blk, in4_byte(d->Mp, m, k - d->k0), k - d->k0, row[k]);
                }
                continue;
            }
            for (uint32_t k = d->k0; k < kend; k++) blk[in_index(d->Mp, m, k - d->k0)] = row[k];
        }
    }
    return ORK_OK;
}

ork_status ork_npu_unpack_input(const ork_npu_plan *p, const uint8_t *buf, int8_t *A, ork_err *err) {
    if (!p || !A || !buf) return ork_err_set(err, ORK_EINVAL, "npu unpack_input: bad arguments");
    for (uint32_t t = 0; t < p->n_tasks; t++) {
        const ork_npu_task_desc *d = &p->tasks[t];
        if (d->ni) continue;
        const int8_t *blk = (const int8_t *)buf + d->in_off;
        uint32_t kend = d->k0 + d->Kt < p->K ? d->k0 + d->Kt : p->K;
        for (uint32_t m = 0; m < d->Mt; m++)
            for (uint32_t k = d->k0; k < kend; k++)
                A[(size_t)(d->m0 + m) * p->K + k] = p->prec == ORK_NPU_PREC_INT4
                                                        ? get4((const uint8_t *)blk, in4_byte(d->Mp, m, k - d->k0), k - d->k0)
                                                        : blk[in_index(d->Mp, m, k - d->k0)];
    }
    return ORK_OK;
}

static size_t w_index(uint32_t Kt, uint32_t n, uint32_t k) {
    return (((size_t)(n / 32) * (Kt / 32) + k / 32) * 32 + n % 32) * 32 + k % 32;
}

ork_status ork_npu_pack_weights(const ork_npu_plan *p, const int8_t *B, size_t ldb, uint8_t *buf, ork_err *err) {
    if (!p || !B || !buf || ldb < p->K) return ork_err_set(err, ORK_EINVAL, "npu pack_weights: bad arguments");
    memset(buf, 0, p->w_bytes);
    for (uint32_t t = 0; t < p->n_tasks; t++) {
        const ork_npu_task_desc *d = &p->tasks[t];
        if (d->mi) continue; /* weight blocks are shared by the m tiles */
        int8_t *blk = (int8_t *)buf + d->w_off;
        uint32_t nend = d->n0 + d->Nt < p->N ? d->n0 + d->Nt : p->N;
        uint32_t kend = d->k0 + d->Kt < p->K ? d->k0 + d->Kt : p->K;
        for (uint32_t n = d->n0; n < nend; n++) {
            const int8_t *row = B + (size_t)n * ldb;
            if (p->prec == ORK_NPU_PREC_INT4) {
                for (uint32_t k = d->k0; k < kend; k++) {
                    if (row[k] < -8 || row[k] > 7) return bad_code(err, "pack_weights", "n", n, k, row[k]);
                    put4((uint8_t *)blk, w4_byte(d->Kt, n - d->n0, k - d->k0), k - d->k0, row[k]);
                }
                continue;
            }
            for (uint32_t k = d->k0; k < kend; k++) blk[w_index(d->Kt, n - d->n0, k - d->k0)] = row[k];
        }
    }
    return ORK_OK;
}

ork_status ork_npu_unpack_weights(const ork_npu_plan *p, const uint8_t *buf, int8_t *B, ork_err *err) {
    if (!p || !B || !buf) return ork_err_set(err, ORK_EINVAL, "npu unpack_weights: bad arguments");
    for (uint32_t t = 0; t < p->n_tasks; t++) {
        const ork_npu_task_desc *d = &p->tasks[t];
        if (d->mi) continue;
        const int8_t *blk = (const int8_t *)buf + d->w_off;
        uint32_t nend = d->n0 + d->Nt < p->N ? d->n0 + d->Nt : p->N;
        uint32_t kend = d->k0 + d->Kt < p->K ? d->k0 + d->Kt : p->K;
        for (uint32_t n = d->n0; n < nend; n++)
            for (uint32_t k = d->k0; k < kend; k++)
                B[(size_t)n * p->K + k] = p->prec == ORK_NPU_PREC_INT4
                                              ? get4((const uint8_t *)blk, w4_byte(d->Kt, n - d->n0, k - d->k0), k - d->k0)
                                              : blk[w_index(d->Kt, n - d->n0, k - d->k0)];
    }
    return ORK_OK;
}

ork_status ork_npu_pack_weights_store(const ork_npu_plan *p, ork_kind kind, const void *store, const int8_t lut[16],
                                      uint8_t *buf, ork_err *err) {
    if (!p || !store || !buf) return ork_err_set(err, ORK_EINVAL, "npu pack_weights_store: bad arguments");
    if (p->prec != ORK_NPU_PREC_INT8)
        return ork_err_set(err, ORK_EINVAL, "npu pack_weights_store: an int4 plan takes int8 codes (pack_weights), not a "
                           "packed store");
    const ork_kind_info *ki = ork_kind_get(kind);
    if (!ki) return ork_err_set(err, ORK_EINVAL, "npu pack_weights_store: unknown kind");
    const int is4 = ki->bits == 4;
    if (is4 && !lut) return ork_err_set(err, ORK_EINVAL, "npu pack_weights_store: a 4-bit store needs its LUT");
    const size_t KB = p->Kp / 32, tile_src = is4 ? 512 : 1024;
    for (uint32_t t = 0; t < p->n_tasks; t++) {
        const ork_npu_task_desc *d = &p->tasks[t];
        if (d->mi) continue;
        int8_t *blk = (int8_t *)buf + d->w_off;
        for (uint32_t nb = 0; nb < d->Nt / 32; nb++)
            for (uint32_t kb = 0; kb < d->Kt / 32; kb++) {
                const uint8_t *src = (const uint8_t *)store + (((size_t)(d->n0 / 32 + nb)) * KB + d->k0 / 32 + kb) * tile_src;
                int8_t *dst = blk + ((size_t)nb * (d->Kt / 32) + kb) * 1024;
                if (!is4) {
                    memcpy(dst, src, 1024);
                } else {
                    for (size_t i = 0; i < 512; i++) {
                        dst[2 * i] = lut[src[i] & 15];
                        dst[2 * i + 1] = lut[src[i] >> 4];
                    }
                }
            }
    }
    return ORK_OK;
}

ork_status ork_npu_unpack_output(const ork_npu_plan *p, const uint8_t *buf, int32_t *C, ork_err *err) {
    if (!p || !buf || !C) return ork_err_set(err, ORK_EINVAL, "npu unpack_output: bad arguments");
    const size_t MN = (size_t)p->M * p->N;
    memset(C, 0, (p->group ? p->nk : 1) * MN * sizeof(int32_t));
    for (uint32_t t = 0; t < p->n_tasks; t++) {
        const ork_npu_task_desc *d = &p->tasks[t];
        const int32_t *blk = (const int32_t *)(const void *)(buf + d->out_off);
        const int16_t *b16 = (const int16_t *)(const void *)(buf + d->out_off);
        uint32_t nend = d->n0 + d->Nt < p->N ? d->n0 + d->Nt : p->N;
        int32_t *base = p->group ? C + d->ki * MN : C; /* grouped: each K tile (group) its own block */
        for (uint32_t m = 0; m < d->Mt; m++) {
            int32_t *row = base + (size_t)(d->m0 + m) * p->N;
            for (uint32_t n = d->n0; n < nend; n++) {
                uint32_t j = n - d->n0;
                /* int32 sum of the K tiles, wrapping arithmetic done unsigned (never overflows for K <= MAX_K);
                 * int4 plans: int16 blocks (N/8, M, 8) */
                int32_t v = p->prec == ORK_NPU_PREC_INT4 ? (int32_t)b16[((size_t)(j / 8) * d->Mp + m) * 8 + j % 8]
                                                         : blk[((size_t)(j / 4) * d->Mp + m) * 4 + j % 4];
                row[n] = (int32_t)((uint32_t)row[n] + (uint32_t)v);
            }
        }
    }
    return ORK_OK;
}
