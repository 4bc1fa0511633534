/* emu.c - see emu.h. */
#include "emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h" /* ORK_NPU_INT4_MAX_KT (a macro: emu.c links no planner) */
#include "regcmd.h"

#define NREG ORK_NPU_TASK_BODY

typedef struct {
    uint32_t target[NREG], reg[NREG];
    size_t n;
} reg_set;

static void body_regs(reg_set *s) {
    uint64_t q[ORK_NPU_TASK_QWORDS];
    ork_npu_matmul_desc m = {ORK_NPU_INT8_INT32, 4, 32, 32, 0, 0, 0};
    ork_npu_matmul_task(&m, q, NULL);
    s->n = 0;
    for (size_t i = 0; i < NREG; i++) {
        s->target[s->n] = ork_npu_target(q[i]);
        s->reg[s->n] = ork_npu_reg(q[i]);
        s->n++;
    }
}

static int find_reg(const reg_set *s, uint32_t target, uint32_t reg) {
    for (size_t i = 0; i < s->n; i++)
        if (s->target[i] == target && s->reg[i] == reg) return (int)i;
    return -1;
}

static const char *nm(uint32_t t, uint32_t r, char *buf, size_t len) {
    const char *tn = ork_npu_target_name(t), *rn = ork_npu_reg_name(t, r);
    if (rn) return rn;
    snprintf(buf, len, "%s 0x%04x", tn ? tn : "?", r);
    return buf;
}

typedef struct {
    uint32_t val[NREG];
    uint8_t set[NREG];
} regfile;

static uint32_t get(const reg_set *s, const regfile *f, uint32_t t, uint32_t r) {
    int i = find_reg(s, t, r);
    return i >= 0 ? f->val[i] : 0;
}

/* int4 x int4 -> int16 (plan.h "int4"; docs/npu.md): feature (K/32, M, 32) and weights (N/64, K/32, 64, 32)
 * nibbles, even k in the low nibble; output (N/8, M, 8) int16. The products of one output are summed in int16
 * on the NPU in an order no public source gives: the task is an error unless EVERY order stays inside int16,
 * i.e. the positive products sum to <= 32767 and the negative ones to >= -32768 (the planner's K tiles of at
 * most 480 codes always do: 480 * 64 = 30720). */
static int nib(const uint8_t *b, size_t i, uint32_t k) {
    const int v = k & 1u ? b[i] >> 4 : b[i] & 15;
    return v >= 8 ? v - 16 : v;
}

static ork_status execute_int4(const ork_npu_mem *mem, const ork_npu_matmul_desc *d, uint32_t t, uint32_t task_addr,
                               ork_err *err) {
    const uint32_t M = d->M, K = d->K, N = d->N;
    const uint8_t *fe = (const uint8_t *)mem->map(mem->ctx, d->in_addr, (uint64_t)M * K / 2);
    const uint8_t *we = (const uint8_t *)mem->map(mem->ctx, d->w_addr, (uint64_t)N * K / 2);
    int16_t *out = (int16_t *)mem->map(mem->ctx, d->out_addr, (uint64_t)M * N * 2);
    if (!fe || !we || !out)
        return ork_err_set(err, ORK_ENPUCMD,
                           "npu emu: task %u at 0x%08x reads or writes outside the mapped buffers (%s at 0x%08x)", t,
                           task_addr, !fe ? "feature" : !we ? "weights" : "output",
                           !fe ? d->in_addr : !we ? d->w_addr : d->out_addr);
    int8_t *A = (int8_t *)malloc((size_t)M * K), *B = (int8_t *)malloc((size_t)N * K);
    if (!A || !B) {
        free(A);
        free(B);
        return ork_err_set(err, ORK_ENOMEM, "npu emu: out of memory");
    }
    for (uint32_t m = 0; m < M; m++)
        for (uint32_t k = 0; k < K; k++) A[(size_t)m * K + k] = (int8_t)nib(fe, ((size_t)(k / 32) * M + m) * 16 + (k % 32) / 2, k);
    for (uint32_t n = 0; n < N; n++)
        for (uint32_t k = 0; k < K; k++)
            B[(size_t)n * K + k] =
                (int8_t)nib(we, (((size_t)(n / 64) * (K / 32) + k / 32) * 64 + n % 64) * 16 + (k % 32) / 2, k);
    ork_status st = ORK_OK;
    for (uint32_t m = 0; m < M && !st; m++)
        for (uint32_t n = 0; n < N; n++) {
            const int8_t *a = A + (size_t)m * K, *bw = B + (size_t)n * K;
            int32_t pos = 0, neg = 0; /* |each| <= 8192 * 64: no int32 overflow */
            for (uint32_t k = 0; k < K; k++) {
                const int32_t v = (int32_t)a[k] * bw[k];
                if (v > 0) pos += v;
                else neg += v;
            }
            if (pos > 32767 || neg < -32768) {
                st = ork_err_set(err, ORK_ENPUCMD,
                                 "npu emu: task %u at 0x%08x (int4 x int4 -> int16, %ux%ux%u): the products of output "
                                 "(m %u, n %u) sum to %d positive / %d negative, outside int16 in some summation order "
                                 "(the planner's int4 K tiles are at most %u codes: %u x 64 <= 32767)",
                                 t, task_addr, M, K, N, m, n, pos, neg, ORK_NPU_INT4_MAX_KT, ORK_NPU_INT4_MAX_KT);
                break;
            }
            out[((size_t)(n / 8) * M + m) * 8 + n % 8] = (int16_t)(pos + neg);
        }
    free(A);
    free(B);
    return st;
}

static ork_status execute(const ork_npu_mem *mem, const reg_set *s, const regfile *f, uint32_t t, uint32_t task_addr,
                          ork_npu_emu_stats *stats, ork_err *err) {
    char b1[32];
    for (size_t i = 0; i < s->n; i++)
        if (!f->set[i])
            return ork_err_set(err, ORK_ENPUCMD, "npu emu: task at 0x%08x enables the op without writing %s", task_addr,
                               nm(s->target[i], s->reg[i], b1, sizeof b1));
    /* decode the precision, shape and addresses, then demand the exact body for them */
    ork_npu_matmul_desc d;
    const uint32_t in_prec = (get(s, f, ORK_NPU_CNA, 0x100c) >> 4) & 7u;
    d.dtype = in_prec == ork_npu_int4.in_prec ? ORK_NPU_INT4_INT16 : ORK_NPU_INT8_INT32; /* else refused below */
    d.M = get(s, f, ORK_NPU_CNA, 0x1020) & 0x7ffu;
    d.K = get(s, f, ORK_NPU_CNA, 0x1024) & 0xffffu;
    d.N = get(s, f, ORK_NPU_CNA, 0x1038) & 0x3fffu;
    d.in_addr = get(s, f, ORK_NPU_CNA, 0x1070);
    d.w_addr = get(s, f, ORK_NPU_CNA, 0x1110);
    d.out_addr = get(s, f, ORK_NPU_DPU, 0x4020);
    const char *mode = d.dtype == ORK_NPU_INT4_INT16 ? "int4 x int4 -> int16" : "int8 x int8 -> int32";
    uint64_t want[ORK_NPU_TASK_QWORDS];
    ork_err e2;
    if (ork_npu_matmul_task(&d, want, &e2) != ORK_OK)
        return ork_err_set(err, ORK_ENPUCMD, "npu emu: task at 0x%08x programs a shape outside the model: %s", task_addr,
                           e2.msg);
    for (size_t i = 0; i < ORK_NPU_TASK_BODY; i++) {
        int j = find_reg(s, ork_npu_target(want[i]), ork_npu_reg(want[i]));
        if (j < 0 || f->val[j] != ork_npu_value(want[i]))
            return ork_err_set(err, ORK_ENPUCMD,
                               "npu emu: task at 0x%08x: %s = 0x%08x, but the modelled %s matmul "
                               "%ux%ux%u needs 0x%08x",
                               task_addr, nm(ork_npu_target(want[i]), ork_npu_reg(want[i]), b1, sizeof b1),
                               j < 0 ? 0 : f->val[j], mode, d.M, d.K, d.N, ork_npu_value(want[i]));
    }
    if ((d.in_addr | d.w_addr | d.out_addr) & 0xfu) /* orkpy aligns to 64; unaligned DMA is not modelled */
        return ork_err_set(err, ORK_ENPUCMD, "npu emu: task at 0x%08x: operand address not 16-byte aligned (feature "
                           "0x%08x, weights 0x%08x, output 0x%08x)", task_addr, d.in_addr, d.w_addr, d.out_addr);
    const uint32_t M = d.M, K = d.K, N = d.N;
    if (stats) stats->macs += (uint64_t)M * K * N;
    if (d.dtype == ORK_NPU_INT4_INT16) return execute_int4(mem, &d, t, task_addr, err);
    const int8_t *fe = (const int8_t *)mem->map(mem->ctx, d.in_addr, (uint64_t)M * K);
    const int8_t *we = (const int8_t *)mem->map(mem->ctx, d.w_addr, (uint64_t)N * K);
    int32_t *out = (int32_t *)mem->map(mem->ctx, d.out_addr, (uint64_t)M * N * 4);
    if (!fe || !we || !out)
        return ork_err_set(err, ORK_ENPUCMD,
                           "npu emu: task at 0x%08x reads or writes outside the mapped buffers (%s at 0x%08x)",
                           task_addr, !fe ? "feature" : !we ? "weights" : "output",
                           !fe ? d.in_addr : !we ? d.w_addr : d.out_addr);
    int8_t *A = (int8_t *)malloc((size_t)M * K), *B = (int8_t *)malloc((size_t)N * K);
    if (!A || !B) {
        free(A);
        free(B);
        return ork_err_set(err, ORK_ENOMEM, "npu emu: out of memory");
    }
    for (uint32_t c1 = 0; c1 < K / 16; c1++) /* feature NC1HWC2, C2 = 16 */
        for (uint32_t m = 0; m < M; m++) memcpy(A + (size_t)m * K + c1 * 16, fe + ((size_t)c1 * M + m) * 16, 16);
    for (uint32_t nb = 0; nb < N / 32; nb++) /* weights (N/32, K/32, 32, 32) */
        for (uint32_t kb = 0; kb < K / 32; kb++)
            for (uint32_t i = 0; i < 32; i++)
                memcpy(B + (size_t)(nb * 32 + i) * K + kb * 32, we + (((size_t)nb * (K / 32) + kb) * 32 + i) * 32, 32);
    for (uint32_t m = 0; m < M; m++) {
        const int8_t *a = A + (size_t)m * K;
        for (uint32_t n = 0; n < N; n++) {
            const int8_t *bw = B + (size_t)n * K;
            int32_t acc = 0; /* |acc| <= 8192 * 128 * 128 = 2^27: no overflow */
            for (uint32_t k = 0; k < K; k++) acc += (int32_t)a[k] * (int32_t)bw[k];
            out[((size_t)(n / 4) * M + m) * 4 + n % 4] = acc; /* output NC1HWC2, C2 = 4 */
        }
    }
    free(A);
    free(B);
    return ORK_OK;
}

ork_status ork_npu_emu_run(const ork_npu_mem *mem, uint32_t first_addr, uint32_t amount, uint32_t task_number,
                           uint32_t *visited, ork_npu_emu_stats *stats, ork_err *err) {
    if (!mem || !mem->map) return ork_err_set(err, ORK_EINVAL, "npu emu: no memory");
    if (task_number == 0) return ork_err_set(err, ORK_ENPUCMD, "npu emu: task_number is 0");
    reg_set s;
    body_regs(&s);
    uint32_t addr = first_addr;
    char b1[32];
    for (uint32_t t = 0; t < task_number; t++) {
        if (addr & 0xfu) return ork_err_set(err, ORK_ENPUCMD, "npu emu: task %u address 0x%08x is not 16-byte aligned", t, addr);
        if (amount == 0 || amount > 0xffffu)
            return ork_err_set(err, ORK_ENPUCMD, "npu emu: task %u at 0x%08x has register amount %u", t, addr, amount);
        const uint64_t count = ((uint64_t)amount + 1) * 2;
        const uint8_t *raw = (const uint8_t *)mem->map(mem->ctx, addr, count * 8);
        if (!raw)
            return ork_err_set(err, ORK_ENPUCMD, "npu emu: task %u: %llu qwords at 0x%08x are outside the mapped buffers", t,
                               (unsigned long long)count, addr);
        if (visited) visited[t] = addr;
        regfile f;
        memset(&f, 0, sizeof f);
        int armed = 0, done = 0, have_base = 0, have_amount = 0;
        uint32_t next_base = 0, next_amount = 0;
        for (uint64_t i = 0; i < count; i++) {
            uint64_t q;
            memcpy(&q, raw + i * 8, 8); /* little-endian host, as the board */
            const uint32_t tg = ork_npu_target(q), rg = ork_npu_reg(q), v = ork_npu_value(q);
            if (done) {
                if (q != 0)
                    return ork_err_set(err, ORK_ENPUCMD, "npu emu: task at 0x%08x: qword %llu (0x%016llx) follows op-enable",
                                       addr, (unsigned long long)i, (unsigned long long)q);
                continue;
            }
            if (q == 0) continue; /* NOP */
            if (tg == ORK_NPU_MARK) {
                if (rg || v)
                    return ork_err_set(err, ORK_ENPUCMD, "npu emu: task at 0x%08x: marker qword 0x%016llx is not 0x0041 << 48",
                                       addr, (unsigned long long)q);
                armed = 1;
                continue;
            }
            if (tg == ORK_NPU_OPEN) {
                if (rg != 0x0008 || v != 0xd)
                    return ork_err_set(err, ORK_ENPUCMD,
                                       "npu emu: task at 0x%08x: op-enable 0x%016llx (only reg 0x0008 = 0xd, CNA+CORE+DPU, "
                                       "is modelled)", addr, (unsigned long long)q);
                if (!armed)
                    return ork_err_set(err, ORK_ENPUCMD, "npu emu: task at 0x%08x: op-enable without the 0x0041 marker before it",
                                       addr);
                ork_status st = execute(mem, &s, &f, t, addr, stats, err);
                if (st) return st;
                done = 1;
                continue;
            }
            if (armed)
                return ork_err_set(err, ORK_ENPUCMD, "npu emu: task at 0x%08x: %s written between the marker and op-enable",
                                   addr, nm(tg, rg, b1, sizeof b1));
            if (tg == ORK_NPU_PC) {
                if (rg == 0x0010) {
                    next_base = v;
                    have_base = 1;
                } else if (rg == 0x0014) {
                    next_amount = v;
                    have_amount = 1;
                } else {
                    return ork_err_set(err, ORK_ENPUCMD, "npu emu: task at 0x%08x: PC register 0x%04x is not modelled", addr, rg);
                }
                continue;
            }
            int j = find_reg(&s, tg, rg);
            if (j < 0)
                return ork_err_set(err, ORK_ENPUCMD, "npu emu: task at 0x%08x: qword %llu writes %s (0x%016llx), which is not modelled",
                                   addr, (unsigned long long)i, nm(tg, rg, b1, sizeof b1), (unsigned long long)q);
            f.val[j] = v;
            f.set[j] = 1;
        }
        if (!done)
            return ork_err_set(err, ORK_ENPUCMD,
                               "npu emu: task at 0x%08x ended after %llu qwords without op-enable (register amount %u too small)",
                               addr, (unsigned long long)count, amount);
        if (stats) {
            stats->tasks++;
            stats->qwords += count;
            stats->last_task_addr = addr;
        }
        if (t + 1 < task_number) {
            if (!have_amount || next_amount == 0)
                return ork_err_set(err, ORK_ENPUCMD, "npu emu: the PC chain ends after task %u of %u (task at 0x%08x)", t + 1,
                                   task_number, addr);
            if (!have_base)
                return ork_err_set(err, ORK_ENPUCMD, "npu emu: task at 0x%08x links on without PC_BASE_ADDRESS", addr);
            if (next_base & 0xfu)
                return ork_err_set(err, ORK_ENPUCMD, "npu emu: task at 0x%08x links to 0x%08x, not 16-byte aligned", addr,
                                   next_base);
            addr = next_base;
            amount = next_amount;
        }
    }
    return ORK_OK;
}
