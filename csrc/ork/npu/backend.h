/* backend.h - one small interface over the ways orkpy runs NPU command
 * streams, and the matmul job built on it.
 *
 *   emu     host buffers with fake 32-bit NPU addresses; submit runs the
 *           strict emulator (emu.h) over the exact command bytes.
 *   rknpu   the vendor driver (DRM device named "rknpu": /dev/dri/renderD*,
 *           then /dev/dri/card*): MEM_CREATE + MEM_MAP + mmap, a task array
 *           in a KERNEL_MAPPING buffer, SUBMIT (PC | BLOCK | PINGPONG) with
 *           regcfg_amount = body qwords, MEM_SYNC around cacheable buffers.
 *   rocket  the mainline accel driver (Linux 6.18+, "rocket",
 *           /dev/accel/accel*): CREATE_BO + mmap, FINI_BO before the job,
 *           SUBMIT with regcmd_count = body + tail, PREP_BO with an
 *           absolute CLOCK_MONOTONIC deadline after it, GEM_CLOSE.
 * The device backends make every system call through an ork_npu_sys table:
 * the real one (sys_linux.c; libdrm loaded at run time) or a fake kernel
 * (tests/npu_fake/fake_kernel.h, test-only: device.h "test kernels") that checks each driver's contract and executes submitted
 * jobs with the emulator. Everything above the table is the same code on a
 * board and here.
 *
 * No RK3588 board was available while this was written: the rknpu and
 * rocket paths have run only against the fake kernel. tests/board/ is the
 * script that checks them on hardware.
 *
 * Thread safety: a device is not thread-safe; device.h serialises calls
 * on one device with its lock.
 */
#ifndef ORK_NPU_BACKEND_H
#define ORK_NPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../quant.h"
#include "../status.h"
#include "plan.h"

/* The system calls a device backend makes. Return conventions: open -> fd
 * or -errno; ioctl / close / munmap -> 0 or -errno; mmap -> pointer or NULL
 * (errno in *err_no); driver_name -> 0 or -errno; list_nodes -> number of
 * paths written (glob semantics, sorted) or -errno. */
typedef struct ork_npu_sys {
    void *ctx;
    const char *name; /* "linux" or "fake-rknpu" / "fake-rocket" */
    int (*open)(void *ctx, const char *path);
    int (*close)(void *ctx, int fd);
    int (*ioctl)(void *ctx, int fd, unsigned long request, void *arg);
    void *(*mmap)(void *ctx, size_t len, int fd, uint64_t offset, int *err_no);
    int (*munmap)(void *ctx, void *p, size_t len);
    int (*driver_name)(void *ctx, int fd, char *buf, size_t len);
    int (*list_nodes)(void *ctx, const char *pattern, char (*paths)[64], int max);
    int64_t (*monotonic_ns)(void *ctx);
    /* optional: detail of the last refused call (fake kernel), or NULL */
    const char *(*last_error)(void *ctx);
} ork_npu_sys;

/* The real system; NULL when libdrm.so.2 cannot be loaded (dlopen, first call) or
 * off Linux, and *why says so. Thread-safe. */
const ork_npu_sys *ork_npu_sys_linux(const char **why);

/* The backends: ork_npu_backend_names[kind] is the name the binding and the
 * Python layer use (orkpy.runtime.npu.BACKENDS is this table). */
typedef enum { ORK_NPU_BE_EMU = 0, ORK_NPU_BE_RKNPU = 1, ORK_NPU_BE_ROCKET = 2 } ork_npu_backend_kind;
#define ORK_NPU_BE_COUNT 3
extern const char *const ork_npu_backend_names[ORK_NPU_BE_COUNT];
/* the backend named `name`: 0 with *kind set, or -1 */
int ork_npu_backend_find(const char *name, ork_npu_backend_kind *kind);

typedef enum {
    ORK_NPU_BO_CMD = 0,    /* command buffer: written by the CPU */
    ORK_NPU_BO_INPUT = 1,  /* written by the CPU, read by the NPU */
    ORK_NPU_BO_OUTPUT = 2, /* written by the NPU, read by the CPU */
    ORK_NPU_BO_TASKS = 3   /* rknpu task array (kernel mapping) */
} ork_npu_bo_usage;

typedef struct ork_npu_bo {
    uint32_t handle;
    uint32_t dma;  /* 32-bit NPU address */
    uint64_t size; /* bytes, page-rounded */
    uint8_t *cpu;  /* host mapping */
    uint64_t obj_addr, map_offset;
    uint32_t flags;
    ork_npu_bo_usage usage;
} ork_npu_bo;

typedef struct ork_npu_dev ork_npu_dev;

typedef struct ork_npu_dev_info {
    const char *backend; /* "emu", "rknpu", "rocket" */
    char node[64];       /* device node, "" for emu */
    char sys[32];        /* "linux", "fake-rknpu", ... */
    uint64_t submits, tasks, bytes_to_device, bytes_from_device;
    uint64_t plans; /* command buffers planned and emitted (every ork_npu_matmul; a job once) */
} ork_npu_dev_info;

/* emu_base: first fake NPU address of the emu backend (0 = 0x1000); buffers
 * grow upwards page by page. sys: NULL = the real system (device backends). */
ork_status ork_npu_dev_open(ork_npu_backend_kind kind, const ork_npu_sys *sys, uint32_t emu_base, ork_npu_dev **out,
                            ork_err *err);
void ork_npu_dev_close(ork_npu_dev *dev);
void ork_npu_dev_get_info(const ork_npu_dev *dev, ork_npu_dev_info *info);
/* Whether a device backend can be opened here; 0 = yes, else why (static text or buf). */
int ork_npu_probe(ork_npu_backend_kind kind, char *why, size_t len);

ork_status ork_npu_bo_alloc(ork_npu_dev *dev, uint64_t size, ork_npu_bo_usage usage, ork_npu_bo *bo, ork_err *err);
void ork_npu_bo_free(ork_npu_dev *dev, ork_npu_bo *bo);

/* ------------------------------------------------------ matmul on a device */
/* Weights resident in a device buffer, laid out for a K x N plan (any M). */
typedef struct ork_npu_weight {
    uint32_t K, N;
    ork_npu_plan_opts opts;
    ork_npu_bo bo;
} ork_npu_weight;

ork_status ork_npu_weight_upload_i8(ork_npu_dev *dev, const int8_t *B, uint32_t N, uint32_t K, size_t ldb,
                                    const ork_npu_plan_opts *opts, ork_npu_weight *w, ork_err *err);
ork_status ork_npu_weight_upload_store(ork_npu_dev *dev, ork_kind kind, const void *store, const int8_t lut[16],
                                       uint32_t N, uint32_t K, const ork_npu_plan_opts *opts, ork_npu_weight *w,
                                       ork_err *err);
void ork_npu_weight_free(ork_npu_dev *dev, ork_npu_weight *w);

/* C (M, N) int32 = A (M, K) int8 (row stride lda) times the resident weight. */
ork_status ork_npu_matmul(ork_npu_dev *dev, const ork_npu_weight *w, const int8_t *A, uint32_t M, size_t lda,
                          int32_t *C, uint32_t timeout_ms, ork_err *err);

/* ------------------------------------------------- planned-once jobs ---- */
/* A job: n resident weights run at M rows as ONE chained submit (plan.h,
 * "chains"). Made once: planned, its own command / input / output buffers
 * allocated and the command buffer emitted and synced; every run then only
 * packs the inputs, submits once and unpacks the outputs (no planning, no
 * emission: info.plans does not move, info.submits grows by one). The
 * weights are borrowed and must outlive the job. A job whose buffers had to
 * be dropped (a rocket timeout) re-allocates and re-emits on its next run. */
typedef struct ork_npu_job {
    uint32_t n, M;
    const ork_npu_weight **w; /* n weights, borrowed (the array is owned) */
    ork_npu_chain chain;
    ork_npu_bo cmd, in, out;
    int emitted;
} ork_npu_job;

ork_status ork_npu_job_make(ork_npu_dev *dev, const ork_npu_weight *const *w, uint32_t n, uint32_t M, ork_npu_job *job,
                            ork_err *err);
/* C[i] (M, N_i) int32 = A[i] (M, K_i) int8 (row stride lda[i]) times weight i, for every i, in one submit. */
ork_status ork_npu_job_run(ork_npu_dev *dev, ork_npu_job *job, const int8_t *const *A, const size_t *lda,
                           int32_t *const *C, uint32_t timeout_ms, ork_err *err);
void ork_npu_job_free(ork_npu_dev *dev, ork_npu_job *job);

#endif
