/* regcmd.c - see regcmd.h. Written from the published facts; no code from
 * the GPL reverse-engineering projects. */
#include "regcmd.h"

#include <string.h>

#define CBUF_BANKS 12u
#define CBUF_BANK_BYTES 32768u

/* ---------------------------------------- int4 values (regcmd.h): UNVERIFIED --
 * No public source gives these; each is listed in docs/npu.md ("int4 register
 * values") and checked first by tests/board/run_board.py. Change them here only. */
#define INT4_PREC 6u       /* int4 precision code: a guess among the codes no public stream uses */
#define INT16_PREC 1u      /* int16: NVDLA's code (RK keeps NVDLA's int8 0 and fp16 2) */
#define INT16_SIZE_E 1u    /* int16 output: as fp16's (2-byte elements, C2 = 8) */
#define INT16_SURF_MUL 2u  /* likewise (size_e = SURFACE_ADD multiplier - 1 in every capture) */
#define INT4_CODES_PER_ENTRY 128u /* 64 feature bytes per CBUF entry, as int8 (64 codes) and fp16 (32) */

const ork_npu_int4_regs ork_npu_int4 = {INT4_PREC, INT4_PREC, INT16_PREC, INT16_SIZE_E, INT16_SURF_MUL,
                                        INT4_CODES_PER_ENTRY};

#define UNVERIFIED_CODE "unverified: no public stream or register database gives an int4 code (public: int8 0, fp16 2, " \
                        "int32 4, fp32 5); a guess"
static const ork_npu_reg_fact int4_facts[] = {
    {"CNA_CONV_CON1", "IN_PRECISION", INT4_PREC, "", UNVERIFIED_CODE},
    {"CNA_CONV_CON1", "PROC_PRECISION", INT4_PREC, "", UNVERIFIED_CODE},
    {"CORE_MISC_CFG", "PROC_PRECISION", INT4_PREC, "", UNVERIFIED_CODE},
    {"DPU_DATA_FORMAT", "IN_PRECISION", INT4_PREC, "", UNVERIFIED_CODE},
    {"DPU_DATA_FORMAT", "PROC_PRECISION", INT4_PREC, "", UNVERIFIED_CODE},
    {"DPU_DATA_FORMAT", "OUT_PRECISION", INT16_PREC, "",
     "unverified: NVDLA's int16 code (RK keeps NVDLA's int8 0 and fp16 2); no RK stream with an int16 output is public"},
    {"DPU_BS_OW_CFG", "SIZE_E_0/1/2", INT16_SIZE_E, "",
     "unverified: int32 7, fp32 3, fp16 1 in the captures (= SURFACE_ADD multiplier - 1); int16 taken as fp16 "
     "(2-byte elements, output C2 = 8: RKNN's int16 C layout (N/8, M, 8))"},
    {"DPU_SURFACE_ADD", "multiplier", INT16_SURF_MUL, "", "unverified: as SIZE_E (fp16's 2)"},
    {"CNA_CBUF_CON1", "DATA_ENTRIES", -1, "ceil(K / 128)",
     "unverified: int8 ceil(K / 64), fp16 ceil(K / 32) (generator, captures) = 64 feature bytes per entry, kept for int4"},
    {"CNA_CBUF_CON0", "DATA_BANK / WEIGHT_BANK", -1, "ceil(M * K / 2 / 32768), 12 - DATA_BANK",
     "unverified: the int8 rule on the feature's bytes (an int4 code is half a byte)"},
    {"CNA_WEIGHT_SIZE0", "WEIGHT_BYTES", -1, "K * N / 2",
     "public field meaning (bytes: Mesa registers.xml); unverified: int4 weights packed two codes per byte"},
    {"CNA_WEIGHT_SIZE1", "WEIGHT_BYTES_PER_KERNEL", -1, "K / 2", "unverified: as WEIGHT_BYTES"},
    {"CNA_DMA_CON1 / DMA_CON2", "LINE_STRIDE / SURF_STRIDE", -1, "4 / M - 4 (as int8)",
     "unverified: a 16-byte atom holds 32 int4 codes as it holds 16 int8 (RKNN's A layouts (K/32, M, 32) vs (K/16, M, 16))"},
    {"CORE_MISC_CFG", "QD_EN", 0, "", "unverified: as int8 (only fp16 sets it in the captures)"},
    {"operands", "nibble order", -1, "low nibble = even k",
     "unverified for the hardware: rk-llama.cpp packs its RKNN_INT4_MM_INT4_TO_INT16 operands low nibble first "
     "(runs on boards); whether librknnrt hands them to the NPU unchanged is not public"},
};

const ork_npu_reg_fact *ork_npu_int4_facts(size_t *n) {
    *n = sizeof int4_facts / sizeof int4_facts[0];
    return int4_facts;
}

typedef struct {
    uint32_t target, reg;
    const char *name;
} reg_name;

static const reg_name names[] = {
    {ORK_NPU_PC, 0x0008, "PC_OPERATION_ENABLE"}, {ORK_NPU_PC, 0x0010, "PC_BASE_ADDRESS"},
    {ORK_NPU_PC, 0x0014, "PC_REGISTER_AMOUNTS"}, {ORK_NPU_CNA, 0x100c, "CNA_CONV_CON1"},
    {ORK_NPU_CNA, 0x1010, "CNA_CONV_CON2"},      {ORK_NPU_CNA, 0x1014, "CNA_CONV_CON3"},
    {ORK_NPU_CNA, 0x1020, "CNA_DATA_SIZE0"},     {ORK_NPU_CNA, 0x1024, "CNA_DATA_SIZE1"},
    {ORK_NPU_CNA, 0x1028, "CNA_DATA_SIZE2"},     {ORK_NPU_CNA, 0x102c, "CNA_DATA_SIZE3"},
    {ORK_NPU_CNA, 0x1030, "CNA_WEIGHT_SIZE0"},   {ORK_NPU_CNA, 0x1034, "CNA_WEIGHT_SIZE1"},
    {ORK_NPU_CNA, 0x1038, "CNA_WEIGHT_SIZE2"},   {ORK_NPU_CNA, 0x1040, "CNA_CBUF_CON0"},
    {ORK_NPU_CNA, 0x1044, "CNA_CBUF_CON1"},      {ORK_NPU_CNA, 0x104c, "CNA_CVT_CON0"},
    {ORK_NPU_CNA, 0x1050, "CNA_CVT_CON1"},       {ORK_NPU_CNA, 0x1054, "CNA_CVT_CON2"},
    {ORK_NPU_CNA, 0x1058, "CNA_CVT_CON3"},       {ORK_NPU_CNA, 0x105c, "CNA_CVT_CON4"},
    {ORK_NPU_CNA, 0x1060, "CNA_FC_CON0"},        {ORK_NPU_CNA, 0x1064, "CNA_FC_CON1"},
    {ORK_NPU_CNA, 0x1068, "CNA_PAD_CON0"},       {ORK_NPU_CNA, 0x1070, "CNA_FEATURE_DATA_ADDR"},
    {ORK_NPU_CNA, 0x1074, "CNA_FC_CON2"},        {ORK_NPU_CNA, 0x1078, "CNA_DMA_CON0"},
    {ORK_NPU_CNA, 0x107c, "CNA_DMA_CON1"},       {ORK_NPU_CNA, 0x1080, "CNA_DMA_CON2"},
    {ORK_NPU_CNA, 0x1084, "CNA_FC_DATA_SIZE0"},  {ORK_NPU_CNA, 0x1088, "CNA_FC_DATA_SIZE1"},
    {ORK_NPU_CNA, 0x1100, "CNA_DCOMP_CTRL"},     {ORK_NPU_CNA, 0x1104, "CNA_DCOMP_REGNUM"},
    {ORK_NPU_CNA, 0x1110, "CNA_DCOMP_ADDR0"},    {ORK_NPU_CNA, 0x1180, "CNA_CVT_CON5"},
    {ORK_NPU_CNA, 0x1184, "CNA_PAD_CON1"},       {ORK_NPU_CORE, 0x3010, "CORE_MISC_CFG"},
    {ORK_NPU_CORE, 0x3014, "CORE_DATAOUT_SIZE_0"}, {ORK_NPU_CORE, 0x3018, "CORE_DATAOUT_SIZE_1"},
    {ORK_NPU_CORE, 0x301c, "CORE_CLIP_TRUNCATE"}, {ORK_NPU_DPU, 0x4004, "DPU_S_POINTER"},
    {ORK_NPU_DPU, 0x400c, "DPU_FEATURE_MODE_CFG"}, {ORK_NPU_DPU, 0x4010, "DPU_DATA_FORMAT"},
    {ORK_NPU_DPU, 0x4014, "DPU_OFFSET_PEND"},    {ORK_NPU_DPU, 0x4020, "DPU_DST_BASE_ADDR"},
    {ORK_NPU_DPU, 0x4024, "DPU_DST_SURF_STRIDE"}, {ORK_NPU_DPU, 0x4030, "DPU_DATA_CUBE_WIDTH"},
    {ORK_NPU_DPU, 0x4034, "DPU_DATA_CUBE_HEIGHT"}, {ORK_NPU_DPU, 0x4038, "DPU_DATA_CUBE_NOTCH"},
    {ORK_NPU_DPU, 0x403c, "DPU_DATA_CUBE_CHANNEL"}, {ORK_NPU_DPU, 0x4040, "DPU_BS_CFG"},
    {ORK_NPU_DPU, 0x4050, "DPU_BS_OW_CFG"},      {ORK_NPU_DPU, 0x4058, "DPU_WDMA_SIZE_0"},
    {ORK_NPU_DPU, 0x405c, "DPU_WDMA_SIZE_1"},    {ORK_NPU_DPU, 0x4060, "DPU_BN_CFG"},
    {ORK_NPU_DPU, 0x4070, "DPU_EW_CFG"},         {ORK_NPU_DPU, 0x4078, "DPU_EW_CVT_SCALE_VALUE"},
    {ORK_NPU_DPU, 0x4084, "DPU_OUT_CVT_SCALE"},  {ORK_NPU_DPU, 0x4088, "DPU_OUT_CVT_SHIFT"},
    {ORK_NPU_DPU, 0x40c0, "DPU_SURFACE_ADD"},
};

const char *ork_npu_target_name(uint32_t t) {
    switch (t) {
    case ORK_NPU_PC: return "PC";
    case ORK_NPU_CNA: return "CNA";
    case ORK_NPU_CORE: return "CORE";
    case ORK_NPU_DPU: return "DPU";
    case ORK_NPU_DPU_RDMA: return "DPU_RDMA";
    case 0x4001: return "PPU";
    case 0x8001: return "PPU_RDMA";
    case ORK_NPU_MARK: return "MARK";
    case ORK_NPU_OPEN: return "OP_EN";
    case 0: return "NOP";
    default: return NULL;
    }
}

const char *ork_npu_reg_name(uint32_t target, uint32_t reg) {
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].target == target && names[i].reg == reg) return names[i].name;
    if (target == ORK_NPU_OPEN && reg == 0x0008) return "PC_OPERATION_ENABLE";
    return NULL;
}

ork_status ork_npu_task_tail(uint64_t out[4], uint32_t next_addr, uint32_t next_body, ork_err *err) {
    if (next_body && (next_addr & 0xfu))
        return ork_err_set(err, ORK_EINVAL, "next task address 0x%08x is not 16-byte aligned", next_addr);
    out[0] = next_body ? ork_npu_qword(ORK_NPU_PC, 0x0010, next_addr) : 0;     /* PC_BASE_ADDRESS */
    out[1] = ork_npu_qword(ORK_NPU_PC, 0x0014, next_body ? ork_npu_pc_amount(next_body) : 0);
    out[2] = (uint64_t)ORK_NPU_MARK << 48;
    out[3] = ork_npu_qword(ORK_NPU_OPEN, 0x0008, 0xd);                         /* op-enable */
    return ORK_OK;
}

ork_status ork_npu_matmul_task(const ork_npu_matmul_desc *d, uint64_t out[ORK_NPU_TASK_QWORDS], ork_err *err) {
    if (!d || !out) return ork_err_set(err, ORK_EINVAL, "npu_matmul_task: NULL argument");
    const int fp16 = d->dtype == ORK_NPU_FP16_FP32, int4 = d->dtype == ORK_NPU_INT4_INT16;
    if (d->dtype != ORK_NPU_INT8_INT32 && !fp16 && !int4) return ork_err_set(err, ORK_EINVAL, "unknown NPU matmul dtype");
    const uint32_t M = d->M, K = d->K, N = d->N, bits = fp16 ? 16 : int4 ? 4 : 8, nal = fp16 ? 16 : int4 ? 64 : 32;
    if (M == 0 || K == 0 || N == 0 || !(M == 1 || M % 4 == 0) || K % 32 || N % nal || K > 8192 || N > 8192 || M > 2047)
        return ork_err_set(err, ORK_EINVAL,
                           "matmul %ux%ux%u outside this task's limits (M = 1 or M %% 4 == 0, M < 2048; K %% 32 == 0; "
                           "N %% %u == 0; K, N <= 8192)", M, K, N, nal);
    uint64_t feature_bytes = (uint64_t)M * K * bits / 8;
    uint32_t data_bank = (uint32_t)((feature_bytes + CBUF_BANK_BYTES - 1) / CBUF_BANK_BYTES);
    if (data_bank > CBUF_BANKS - 1)
        return ork_err_set(err, ORK_EINVAL, "feature data of %ux%u needs %u CBUF banks (at most 11)", M, K, data_bank);
    if ((uint64_t)K * bits / 8 > CBUF_BANK_BYTES)
        return ork_err_set(err, ORK_EINVAL, "one kernel of K = %u does not fit a CBUF bank", K);
    const uint32_t weight_bank = CBUF_BANKS - data_bank;
    /* precision enum: int8 0, fp16 2, int32 4, fp32 5 (public); int4 / int16: ork_npu_int4 (unverified) */
    const uint32_t in_prec = fp16 ? 2 : int4 ? ork_npu_int4.in_prec : 0;
    const uint32_t proc_prec = fp16 ? 2 : int4 ? ork_npu_int4.proc_prec : 0;
    const uint32_t out_prec = fp16 ? 5 : int4 ? ork_npu_int4.out_prec : 4;
    const uint32_t out_size_e = fp16 ? 3 : int4 ? ork_npu_int4.size_e : 7, surf_mul = fp16 ? 4 : int4 ? ork_npu_int4.surf_mul : 8;
    const uint32_t per_entry = fp16 ? 32 : int4 ? ork_npu_int4.codes_per_entry : 64, entries = (K + per_entry - 1) / per_entry;
    const uint32_t kbytes = K * bits / 8;
    size_t n = 0;
#define E(t, r, v) out[n++] = ork_npu_qword((t), (r), (uint32_t)(v))
    E(ORK_NPU_DPU, 0x4004, 0xe); /* S_POINTER: pp mode, executer/pointer ping-pong */
    E(ORK_NPU_CNA, 0x100c, proc_prec << 7 | in_prec << 4);      /* CONV_CON1, conv_mode direct */
    E(ORK_NPU_CNA, 0x1010, (M + 1) << 4);                        /* CONV_CON2: feature grains */
    E(ORK_NPU_CNA, 0x1014, 0x9);                                 /* CONV_CON3: strides 1 */
    E(ORK_NPU_CNA, 0x1020, 1u << 16 | M);                        /* DATA_SIZE0: width 1, height M */
    E(ORK_NPU_CNA, 0x1024, (K - 1) << 16 | K);                   /* DATA_SIZE1: channels */
    E(ORK_NPU_CNA, 0x1028, 1);                                   /* DATA_SIZE2: output width */
    E(ORK_NPU_CNA, 0x102c, M);                                   /* DATA_SIZE3: atomics */
    E(ORK_NPU_CNA, 0x1030, kbytes * N);                          /* WEIGHT_SIZE0: bytes */
    E(ORK_NPU_CNA, 0x1034, kbytes);                              /* WEIGHT_SIZE1: bytes per kernel */
    E(ORK_NPU_CNA, 0x1038, 1u << 24 | 1u << 16 | N);             /* WEIGHT_SIZE2: 1x1 kernels, N */
    E(ORK_NPU_CNA, 0x1040, weight_bank << 4 | data_bank);        /* CBUF_CON0 */
    E(ORK_NPU_CNA, 0x1044, entries);                             /* CBUF_CON1: data entries */
    E(ORK_NPU_CNA, 0x104c, 0xb);                                 /* CVT_CON0: bypass */
    for (uint32_t r = 0x1050; r <= 0x105c; r += 4) E(ORK_NPU_CNA, r, 1u << 16); /* CVT_CON1..4: scale 1 */
    for (uint32_t r = 0x1060; r <= 0x1068; r += 4) E(ORK_NPU_CNA, r, 0);        /* FC_CON0/1, PAD_CON0 */
    E(ORK_NPU_CNA, 0x1070, d->in_addr);                          /* FEATURE_DATA_ADDR */
    E(ORK_NPU_CNA, 0x1074, 0);                                   /* FC_CON2 */
    E(ORK_NPU_CNA, 0x1078, 15u << 16 | 15u);                     /* DMA_CON0: bursts */
    E(ORK_NPU_CNA, 0x107c, 4);                                   /* DMA_CON1: line stride */
    E(ORK_NPU_CNA, 0x1080, (M - 4) & 0x0fffffffu);               /* DMA_CON2: surface stride (28 bits) */
    E(ORK_NPU_CNA, 0x1084, 1u << 16 | M);                        /* FC_DATA_SIZE0 */
    E(ORK_NPU_CNA, 0x1088, K);                                   /* FC_DATA_SIZE1 */
    E(ORK_NPU_CNA, 0x1100, 0);                                   /* DCOMP_CTRL */
    E(ORK_NPU_CNA, 0x1104, 0);                                   /* DCOMP_REGNUM */
    E(ORK_NPU_CNA, 0x1110, d->w_addr);                           /* DCOMP_ADDR0: weights */
    for (uint32_t r = 0x1140; r <= 0x117c; r += 4) E(ORK_NPU_CNA, r, 0);        /* DCOMP_AMOUNT0..15 */
    E(ORK_NPU_CNA, 0x1180, 0);                                   /* CVT_CON5 */
    E(ORK_NPU_CNA, 0x1184, 0);                                   /* PAD_CON1 */
    E(ORK_NPU_CORE, 0x3010, proc_prec << 8 | (fp16 ? 1u : 0u));  /* MISC_CFG: qd_en for fp16 */
    E(ORK_NPU_CORE, 0x3014, (M - 1) << 16);                      /* DATAOUT_SIZE_0 */
    E(ORK_NPU_CORE, 0x3018, N - 1);                              /* DATAOUT_SIZE_1 */
    E(ORK_NPU_CORE, 0x301c, 0);                                  /* CLIP_TRUNCATE */
    E(ORK_NPU_CORE, 0x3030, 0);                                  /* (undocumented, 0) */
    E(ORK_NPU_DPU, 0x400c, 15u << 5 | 2u << 1);                  /* FEATURE_MODE_CFG: burst, output mode */
    E(ORK_NPU_DPU, 0x4010, out_prec << 29 | in_prec << 26 | proc_prec); /* DATA_FORMAT */
    E(ORK_NPU_DPU, 0x4014, 0);                                   /* OFFSET_PEND */
    E(ORK_NPU_DPU, 0x4020, d->out_addr);                         /* DST_BASE_ADDR */
    E(ORK_NPU_DPU, 0x4024, M << 4);                              /* DST_SURF_STRIDE */
    E(ORK_NPU_DPU, 0x4030, 0);                                   /* DATA_CUBE_WIDTH - 1 */
    E(ORK_NPU_DPU, 0x4034, M - 1);                               /* DATA_CUBE_HEIGHT - 1 */
    E(ORK_NPU_DPU, 0x4038, 0);                                   /* DATA_CUBE_NOTCH */
    E(ORK_NPU_DPU, 0x403c, (N - 1) << 16 | (N - 1));             /* DATA_CUBE_CHANNEL */
    E(ORK_NPU_DPU, 0x4040, 0x53);                                /* BS_CFG: bypass */
    for (uint32_t r = 0x4044; r <= 0x404c; r += 4) E(ORK_NPU_DPU, r, 0);
    E(ORK_NPU_DPU, 0x4050, out_size_e << 8 | out_size_e << 5 | out_size_e << 2 | 1u << 1); /* BS_OW_CFG */
    E(ORK_NPU_DPU, 0x4054, 0);                                   /* BS_OW_OP */
    E(ORK_NPU_DPU, 0x4058, N - 1);                               /* WDMA_SIZE_0 */
    E(ORK_NPU_DPU, 0x405c, (M - 1) << 16);                       /* WDMA_SIZE_1 */
    E(ORK_NPU_DPU, 0x4060, 0x53);                                /* BN_CFG: bypass */
    for (uint32_t r = 0x4064; r <= 0x406c; r += 4) E(ORK_NPU_DPU, r, 0);
    E(ORK_NPU_DPU, 0x4070, 0x383);                               /* EW_CFG: bypass */
    E(ORK_NPU_DPU, 0x4074, 0);
    E(ORK_NPU_DPU, 0x4078, 1);                                   /* EW_CVT_SCALE_VALUE */
    E(ORK_NPU_DPU, 0x407c, 0);
    E(ORK_NPU_DPU, 0x4080, 0);
    E(ORK_NPU_DPU, 0x4084, 1);                                   /* OUT_CVT_SCALE (fp32tofp16 off) */
    E(ORK_NPU_DPU, 0x4088, 0);                                   /* OUT_CVT_SHIFT */
    for (uint32_t r = 0x4090; r <= 0x40ac; r += 4) E(ORK_NPU_DPU, r, 0);        /* EW_OP_VALUE 0..7 */
    E(ORK_NPU_DPU, 0x40c0, (M * surf_mul) << 4);                 /* SURFACE_ADD */
    E(ORK_NPU_DPU, 0x40c4, 0);
    for (uint32_t r = 0x4100; r <= 0x412c; r += 4) E(ORK_NPU_DPU, r, 0);        /* LUT registers */
#undef E
    ork_npu_task_tail(out + n, 0, 0, NULL); /* single-task tail */
    n += 4;
    if (n != ORK_NPU_TASK_QWORDS) return ork_err_set(err, ORK_EINVAL, "internal: task has %zu qwords", n);
    return ORK_OK;
}
