/* fuzz_npu_emu.c - libFuzzer target for the strict NPU emulator
 * (csrc/ork/npu/emu.c) over untrusted command bytes.
 *
 * Input: byte 0 = task_number - 1 (low 3 bits: 1..8 tasks), byte 1 = PC
 * amount (0..255), the rest = the command buffer, mapped at CMD_ADDR.
 * Three 256 KiB operand buffers are mapped at IN_ADDR, W_ADDR, OUT_ADDR (the
 * seeds in seeds_npu.py are orkpy's own streams for these addresses). The
 * emulator must never read or write outside the mapped buffers, whatever the
 * bytes say: any refusal is a status code, never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "npu/emu.h"

#define CMD_ADDR 0x00010000u
#define IN_ADDR 0x00100000u
#define W_ADDR 0x00200000u
#define OUT_ADDR 0x00300000u
#define BUF 262144u

typedef struct {
    uint8_t *cmd;
    size_t cmd_len;
    uint8_t *ops[3];
} mem_t;

static void *map(void *ctx, uint32_t addr, uint64_t len) {
    mem_t *m = (mem_t *)ctx;
    if (addr >= CMD_ADDR && (uint64_t)addr - CMD_ADDR + len <= m->cmd_len) return m->cmd + (addr - CMD_ADDR);
    static const uint32_t base[3] = {IN_ADDR, W_ADDR, OUT_ADDR};
    for (int i = 0; i < 3; i++)
        if (addr >= base[i] && (uint64_t)addr - base[i] + len <= BUF) return m->ops[i] + (addr - base[i]);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    mem_t m;
    m.cmd_len = size - 2;
    m.cmd = (uint8_t *)malloc(m.cmd_len ? m.cmd_len : 1); /* exact size: ASan sees any overrun */
    memcpy(m.cmd, data + 2, m.cmd_len);
    for (int i = 0; i < 3; i++) {
        m.ops[i] = (uint8_t *)malloc(BUF);
        memset(m.ops[i], (int)(i * 37 + 1), BUF);
    }
    ork_npu_mem mem = {&m, map};
    ork_npu_emu_stats st;
    memset(&st, 0, sizeof st);
    ork_err err;
    (void)ork_npu_emu_run(&mem, CMD_ADDR, data[1], (uint32_t)(data[0] & 7) + 1, NULL, &st, &err);
    free(m.cmd);
    for (int i = 0; i < 3; i++) free(m.ops[i]);
    return 0;
}
