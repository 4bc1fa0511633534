/* uapi.h - the kernel ABI of the two RK3588 NPU drivers, typed by orkpy.
 *
 * Written from the published struct layouts of the vendor rknpu driver 0.9.8
 * (include/rknpu_ioctl.h) and of mainline include/uapi/drm/rocket_accel.h
 * (Linux 6.18), with sizes, offsets and ioctl numbers measured with gcc on
 * x86_64 (docs/npu.md, "Sources of the facts"). No header text was copied (the vendor header is GPL-2.0 without
 * the syscall note); names are orkpy's own. Both ABIs are LP64-identical on
 * x86_64 and aarch64: the _Static_asserts below are compiled on both (the
 * aarch64 cross build in tests/test_npu.py, test_uapi_abi_asserts_compile_x86_and_aarch64).
 *
 * Ioctl numbers are computed with the asm-generic encoding (x86_64 and arm64
 * share it): dir << 30 | size << 16 | type << 8 | nr, type 'd' (DRM), nr
 * DRM_COMMAND_BASE (0x40) + command.
 */
#ifndef ORK_NPU_UAPI_H
#define ORK_NPU_UAPI_H

#include <stddef.h>
#include <stdint.h>

#define ORK_IOC_WRITE 1u /* user -> kernel */
#define ORK_IOC_READ 2u
#define ORK_IOC(dir, type, nr, size) (((uint32_t)(dir) << 30) | ((uint32_t)(size) << 16) | ((uint32_t)(type) << 8) | (uint32_t)(nr))
#define ORK_DRM_IOWR(nr, T) ORK_IOC(ORK_IOC_READ | ORK_IOC_WRITE, 'd', 0x40u + (nr), sizeof(T))
#define ORK_DRM_IOW(nr, T) ORK_IOC(ORK_IOC_WRITE, 'd', 0x40u + (nr), sizeof(T))

/* ------------------------------------------------ vendor rknpu (0.9.8) -- */
enum {
    ORK_RKNPU_MEM_NON_CONTIGUOUS = 1u << 0,
    ORK_RKNPU_MEM_CACHEABLE = 1u << 1,
    ORK_RKNPU_MEM_WRITE_COMBINE = 1u << 2,
    ORK_RKNPU_MEM_KERNEL_MAPPING = 1u << 3,
    ORK_RKNPU_MEM_IOMMU = 1u << 4,
    ORK_RKNPU_MEM_ZEROING = 1u << 5,
    ORK_RKNPU_MEM_SECURE = 1u << 6,
    ORK_RKNPU_MEM_DMA32 = 1u << 7,
    ORK_RKNPU_MEM_TRY_ALLOC_SRAM = 1u << 8,
    ORK_RKNPU_MEM_TRY_ALLOC_NBUF = 1u << 9,
    ORK_RKNPU_MEM_IOMMU_LIMIT_IOVA_ALIGNMENT = 1u << 10,
    ORK_RKNPU_MEM_FLAGS_ALL = (1u << 11) - 1u
};
enum { ORK_RKNPU_MEM_SYNC_TO_DEVICE = 1u, ORK_RKNPU_MEM_SYNC_FROM_DEVICE = 2u };
enum {
    ORK_RKNPU_JOB_PC = 1u << 0,
    ORK_RKNPU_JOB_NONBLOCK = 1u << 1,
    ORK_RKNPU_JOB_PINGPONG = 1u << 2,
    ORK_RKNPU_JOB_FENCE_IN = 1u << 3,
    ORK_RKNPU_JOB_FENCE_OUT = 1u << 4
};
enum { ORK_RKNPU_GET_HW_VERSION = 0, ORK_RKNPU_GET_DRV_VERSION = 1, ORK_RKNPU_ACT_RESET = 6 };
#define ORK_RKNPU_PC_DATA_EXTRA_AMOUNT 4u /* the tail the driver adds to regcfg_amount */
#define ORK_RKNPU_INT_CLEAR_ALL 0x1ffffu
#define ORK_RKNPU_MAX_TASKS 4095u /* pc_task_number_bits = 12 */

typedef struct ork_rknpu_mem_create {
    uint32_t handle;
    uint32_t flags;
    uint64_t size;
    uint64_t obj_addr; /* out: a kernel pointer, only ever handed back to the driver */
    uint64_t dma_addr; /* out: the NPU (IOMMU) address */
    uint64_t sram_size;
    int32_t iommu_domain_id;
    uint32_t core_mask;
} ork_rknpu_mem_create;

typedef struct ork_rknpu_mem_map {
    uint32_t handle;
    uint32_t reserved;
    uint64_t offset; /* out: mmap offset */
} ork_rknpu_mem_map;

typedef struct ork_rknpu_mem_destroy {
    uint32_t handle;
    uint32_t reserved;
    uint64_t obj_addr;
} ork_rknpu_mem_destroy;

typedef struct ork_rknpu_mem_sync {
    uint32_t flags;
    uint32_t reserved;
    uint64_t obj_addr;
    uint64_t offset;
    uint64_t size;
} ork_rknpu_mem_sync;

#pragma pack(push, 1)
typedef struct ork_rknpu_task {
    uint32_t flags;
    uint32_t op_idx;
    uint32_t enable_mask;
    uint32_t int_mask;
    uint32_t int_clear;
    uint32_t int_status;
    uint32_t regcfg_amount; /* body qwords, without the 4-qword tail */
    uint32_t regcfg_offset;
    uint64_t regcmd_addr;
} ork_rknpu_task;
#pragma pack(pop)

typedef struct ork_rknpu_subcore_task {
    uint32_t task_start;
    uint32_t task_number;
} ork_rknpu_subcore_task;

typedef struct ork_rknpu_submit {
    uint32_t flags;
    uint32_t timeout; /* ms */
    uint32_t task_start;
    uint32_t task_number;
    uint32_t task_counter;
    int32_t priority;
    uint64_t task_obj_addr; /* obj_addr of a KERNEL_MAPPING BO holding the task array */
    uint32_t iommu_domain_id;
    uint32_t reserved;
    uint64_t task_base_addr;
    int64_t hw_elapse_time;
    uint32_t core_mask;
    int32_t fence_fd;
    ork_rknpu_subcore_task subcore_task[5];
} ork_rknpu_submit;

typedef struct ork_rknpu_action {
    uint32_t flags;
    uint32_t value;
} ork_rknpu_action;

#define ORK_RKNPU_IOCTL_ACTION ORK_DRM_IOWR(0x00u, ork_rknpu_action)
#define ORK_RKNPU_IOCTL_SUBMIT ORK_DRM_IOWR(0x01u, ork_rknpu_submit)
#define ORK_RKNPU_IOCTL_MEM_CREATE ORK_DRM_IOWR(0x02u, ork_rknpu_mem_create)
#define ORK_RKNPU_IOCTL_MEM_MAP ORK_DRM_IOWR(0x03u, ork_rknpu_mem_map)
#define ORK_RKNPU_IOCTL_MEM_DESTROY ORK_DRM_IOWR(0x04u, ork_rknpu_mem_destroy)
#define ORK_RKNPU_IOCTL_MEM_SYNC ORK_DRM_IOWR(0x05u, ork_rknpu_mem_sync)

/* ------------------------------------------------ mainline rocket -------- */
typedef struct ork_rocket_create_bo {
    uint32_t size;
    uint32_t handle;      /* out */
    uint64_t dma_address; /* out: NPU address, per file descriptor */
    uint64_t offset;      /* out: mmap offset */
} ork_rocket_create_bo;

typedef struct ork_rocket_prep_bo {
    uint32_t handle;
    uint32_t reserved;  /* must be 0 */
    int64_t timeout_ns; /* ABSOLUTE CLOCK_MONOTONIC deadline */
} ork_rocket_prep_bo;

typedef struct ork_rocket_fini_bo {
    uint32_t handle;
    uint32_t reserved; /* must be 0 */
} ork_rocket_fini_bo;

typedef struct ork_rocket_task {
    uint32_t regcmd;       /* NPU address of the task's commands */
    uint32_t regcmd_count; /* qwords, INCLUDING the 4-qword tail */
} ork_rocket_task;

typedef struct ork_rocket_job {
    uint64_t tasks; /* user pointer to ork_rocket_task[task_count] */
    uint64_t in_bo_handles;
    uint64_t out_bo_handles;
    uint32_t task_count;
    uint32_t task_struct_size;
    uint32_t in_bo_handle_count;
    uint32_t out_bo_handle_count;
} ork_rocket_job;

typedef struct ork_rocket_submit {
    uint64_t jobs;
    uint32_t job_count;
    uint32_t job_struct_size;
    uint64_t reserved; /* must be 0 */
} ork_rocket_submit;

typedef struct ork_drm_gem_close {
    uint32_t handle;
    uint32_t pad;
} ork_drm_gem_close;

#define ORK_ROCKET_IOCTL_CREATE_BO ORK_DRM_IOWR(0x00u, ork_rocket_create_bo)
#define ORK_ROCKET_IOCTL_SUBMIT ORK_DRM_IOW(0x01u, ork_rocket_submit)
#define ORK_ROCKET_IOCTL_PREP_BO ORK_DRM_IOW(0x02u, ork_rocket_prep_bo)
#define ORK_ROCKET_IOCTL_FINI_BO ORK_DRM_IOW(0x03u, ork_rocket_fini_bo)
/* generic DRM_IOCTL_GEM_CLOSE = DRM_IOW(0x09, struct drm_gem_close) (drm.h) */
#define ORK_DRM_IOCTL_GEM_CLOSE ORK_IOC(ORK_IOC_WRITE, 'd', 0x09u, sizeof(ork_drm_gem_close))

/* ------------------------------------------------ ABI checks ------------ */
_Static_assert(sizeof(ork_rknpu_mem_create) == 48, "rknpu_mem_create is 48 bytes (0.9.8)");
_Static_assert(offsetof(ork_rknpu_mem_create, sram_size) == 32, "rknpu_mem_create.sram_size @32");
_Static_assert(offsetof(ork_rknpu_mem_create, iommu_domain_id) == 40, "rknpu_mem_create.iommu_domain_id @40");
_Static_assert(offsetof(ork_rknpu_mem_create, core_mask) == 44, "rknpu_mem_create.core_mask @44");
_Static_assert(sizeof(ork_rknpu_mem_map) == 16, "rknpu_mem_map is 16 bytes");
_Static_assert(sizeof(ork_rknpu_mem_destroy) == 16, "rknpu_mem_destroy is 16 bytes");
_Static_assert(sizeof(ork_rknpu_mem_sync) == 32, "rknpu_mem_sync is 32 bytes");
_Static_assert(sizeof(ork_rknpu_task) == 40, "rknpu_task is 40 bytes, packed");
_Static_assert(offsetof(ork_rknpu_task, regcmd_addr) == 32, "rknpu_task.regcmd_addr @32");
_Static_assert(sizeof(ork_rknpu_submit) == 104, "rknpu_submit is 104 bytes");
_Static_assert(offsetof(ork_rknpu_submit, task_obj_addr) == 24, "rknpu_submit.task_obj_addr @24");
_Static_assert(offsetof(ork_rknpu_submit, iommu_domain_id) == 32, "rknpu_submit.iommu_domain_id @32");
_Static_assert(offsetof(ork_rknpu_submit, task_base_addr) == 40, "rknpu_submit.task_base_addr @40");
_Static_assert(offsetof(ork_rknpu_submit, hw_elapse_time) == 48, "rknpu_submit.hw_elapse_time @48");
_Static_assert(offsetof(ork_rknpu_submit, core_mask) == 56, "rknpu_submit.core_mask @56");
_Static_assert(offsetof(ork_rknpu_submit, fence_fd) == 60, "rknpu_submit.fence_fd @60");
_Static_assert(offsetof(ork_rknpu_submit, subcore_task) == 64, "rknpu_submit.subcore_task @64");
_Static_assert(sizeof(ork_rknpu_action) == 8, "rknpu_action is 8 bytes");
_Static_assert(sizeof(ork_rocket_create_bo) == 24, "drm_rocket_create_bo is 24 bytes");
_Static_assert(sizeof(ork_rocket_prep_bo) == 16, "drm_rocket_prep_bo is 16 bytes");
_Static_assert(sizeof(ork_rocket_fini_bo) == 8, "drm_rocket_fini_bo is 8 bytes");
_Static_assert(sizeof(ork_rocket_task) == 8, "drm_rocket_task is 8 bytes");
_Static_assert(sizeof(ork_rocket_job) == 40, "drm_rocket_job is 40 bytes");
_Static_assert(offsetof(ork_rocket_job, task_count) == 24, "drm_rocket_job.task_count @24");
_Static_assert(sizeof(ork_rocket_submit) == 24, "drm_rocket_submit is 24 bytes");
_Static_assert(offsetof(ork_rocket_submit, reserved) == 16, "drm_rocket_submit.reserved @16");
_Static_assert(ORK_RKNPU_IOCTL_ACTION == 0xc0086440u, "DRM_IOCTL_RKNPU_ACTION");
_Static_assert(ORK_RKNPU_IOCTL_SUBMIT == 0xc0686441u, "DRM_IOCTL_RKNPU_SUBMIT");
_Static_assert(ORK_RKNPU_IOCTL_MEM_CREATE == 0xc0306442u, "DRM_IOCTL_RKNPU_MEM_CREATE (48 B)");
_Static_assert(ORK_RKNPU_IOCTL_MEM_MAP == 0xc0106443u, "DRM_IOCTL_RKNPU_MEM_MAP");
_Static_assert(ORK_RKNPU_IOCTL_MEM_DESTROY == 0xc0106444u, "DRM_IOCTL_RKNPU_MEM_DESTROY");
_Static_assert(ORK_RKNPU_IOCTL_MEM_SYNC == 0xc0206445u, "DRM_IOCTL_RKNPU_MEM_SYNC");
_Static_assert(ORK_ROCKET_IOCTL_CREATE_BO == 0xc0186440u, "DRM_IOCTL_ROCKET_CREATE_BO");
_Static_assert(ORK_ROCKET_IOCTL_SUBMIT == 0x40186441u, "DRM_IOCTL_ROCKET_SUBMIT");
_Static_assert(ORK_ROCKET_IOCTL_PREP_BO == 0x40106442u, "DRM_IOCTL_ROCKET_PREP_BO");
_Static_assert(ORK_ROCKET_IOCTL_FINI_BO == 0x40086443u, "DRM_IOCTL_ROCKET_FINI_BO");
_Static_assert(ORK_DRM_IOCTL_GEM_CLOSE == 0x40086409u, "DRM_IOCTL_GEM_CLOSE");

#endif
