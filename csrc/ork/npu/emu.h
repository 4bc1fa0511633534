/* emu.h - a strict emulator of the RK3588 NPU command processor for the
 * operations orkpy emits.
 *
 * What it models (from the RK3588 TRM's PC description and the public
 * generator's register programming; docs/npu.md, "Sources of the facts"):
 *  - the PC: fetches (amount + 1) * 2 qwords from a 32-bit NPU address,
 *    writes each (target, register, value) into that block's register file,
 *    and on the 0x0041 marker followed by op-enable (0x0081, reg 0x0008)
 *    executes the programmed operation; then, while tasks remain
 *    (task_number, as PC_TASK_CONTROL), continues at PC_BASE_ADDRESS with
 *    PC_REGISTER_AMOUNTS from the task's tail;
 *  - CNA + CORE + DPU in two modes: int8 x int8 -> int32 1x1 direct
 *    convolution with feature cube H = M, W = 1, C = K (NC1HWC2, C2 = 16),
 *    weights (N/32, K/32, 32, 32), output NC1HWC2 int32 (C2 = 4), with all of
 *    BS / BN / EW / output conversion bypassed (regcmd.h's body); and the
 *    same body in int4 x int4 -> int16 (the task's CNA_CONV_CON1 precision is
 *    regcmd.h's int4 code): feature (K/32, M, 32), weights (N/64, K/32, 64, 32)
 *    nibbles (even k low), output (N/8, M, 8) int16 (plan.h "int4"). An int4
 *    task is exact and strict: it is an ORK_ENPUCMD error naming the task
 *    unless every output's positive products sum to <= 32767 and its
 *    negative ones to >= -32768 (then no summation order leaves int16; the
 *    planner's K tiles of at most 480 codes always satisfy it).
 * Strict: every register must be one the body writes, and every value must
 * be the one the body writes for the decoded shape (a register outside the
 * model, a different constant, an inconsistent size field, a missing
 * register, a buffer outside the mapped memory, a broken chain) is an
 * ORK_ENPUCMD error naming the qword -- never a guess. Registers are checked
 * per task: every modelled register must be written before op-enable (the
 * hardware keeps stale values; the emulator refuses to rely on them).
 *
 * Not modelled (refused): fp16 / other precisions, DPU requantisation,
 * LUTs, element-wise ops, PPU, weight decompression, multi-core pointers.
 * These are provisional facts until a board confirms them: the emulator
 * defines what orkpy's command streams MEAN, the board test
 * (tests/board/) checks that the hardware agrees.
 */
#ifndef ORK_NPU_EMU_H
#define ORK_NPU_EMU_H

#include <stdint.h>

#include "../status.h"

/* NPU memory as the emulator sees it: map returns a host pointer to
 * [addr, addr + len) when that range lies inside one buffer, else NULL. */
typedef struct ork_npu_mem {
    void *ctx;
    void *(*map)(void *ctx, uint32_t addr, uint64_t len);
} ork_npu_mem;

typedef struct ork_npu_emu_stats {
    uint64_t tasks, qwords, macs;
    uint32_t last_task_addr; /* NPU address of the last task executed */
} ork_npu_emu_stats;

/* Run task_number tasks starting at first_addr with PC_DATA_AMOUNT amount.
 * visited (optional, task_number entries) receives each task's address. */
ork_status ork_npu_emu_run(const ork_npu_mem *mem, uint32_t first_addr, uint32_t amount, uint32_t task_number,
                           uint32_t *visited, ork_npu_emu_stats *stats, ork_err *err);

#endif
