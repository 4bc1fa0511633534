/* fake_kernel.h - a fake of the rknpu and rocket kernel drivers behind the
 * device backends' system-call table, for testing the device paths end to
 * end without a board. Test machinery only: not part of the shipped
 * extension; tests/cbuild.py links it into the C tests and builds it as a
 * shared library that the Python tests load (csrc/ork/npu/device.h,
 * "test kernels").
 *
 * It enforces each driver's documented contract (docs/npu.md) and is
 * stricter than the real kernels where they would crash or silently ignore
 * errors; a refused call returns an errno and leaves a message
 * (ork_fake_kernel_last_error, also surfaced by the backend as
 * NPUCommandError):
 *  rknpu  - handles and obj_addr pairs must be live; reserved fields 0; MEM_MAP
 *           before mmap, mmap only at a MEM_MAP offset and within the buffer;
 *           cacheable buffers are NOT coherent: the device sees CPU writes only
 *           after MEM_SYNC(TO_DEVICE), the CPU sees results only after
 *           MEM_SYNC(FROM_DEVICE); SUBMIT: PC mode, blocking, fence_fd -1,
 *           task_obj_addr must be the obj_addr of a KERNEL_MAPPING buffer (the
 *           real driver dereferences it as a kernel pointer), 1..4095 tasks
 *           inside it, subcore_task[0] = {task_start, task_number},
 *           enable_mask 0xd, regcfg_amount = body qwords (the PC fetches
 *           body + 4), regcmd_addr inside a buffer; then the PC runs with
 *           PC_DATA_AMOUNT = (amount + 4 + 1) / 2 - 1 and follows the chain, and
 *           the tasks it visits must be the task records' regcmd_addr.
 *           A timed-out job leaves the core needing ACTION(RESET).
 *  rocket - job_struct_size >= 40, task_struct_size >= 8, reserved 0,
 *           task_count > 0, regcmd_count > 0 (it includes the tail), valid BO
 *           handles; BOs are never coherent: FINI_BO before the NPU reads
 *           (a submitted input BO whose CPU view differs from the device view
 *           is refused), PREP_BO after: its timeout_ns is an ABSOLUTE
 *           CLOCK_MONOTONIC deadline (the fake clock starts at 10^15 ns, so a
 *           relative value is in the past and gives EBUSY while the job is
 *           pending, as on the real driver); one task per PC run.
 * Faults that tests can inject: ORK_FAKE_HANG (jobs never complete),
 * ORK_FAKE_NO_DEVICE (only a foreign DRM node is present), ORK_FAKE_DROP
 * (SUBMIT succeeds but the job never runs: rocket ignores per-job errors).
 */
#ifndef ORK_NPU_FAKE_KERNEL_H
#define ORK_NPU_FAKE_KERNEL_H

#include "../../csrc/ork/npu/backend.h"
#include "../../csrc/ork/npu/device.h"

/* the symbol the test library exports (built with -fvisibility=hidden) */
#if defined(__GNUC__)
#define ORK_FAKE_EXPORT __attribute__((visibility("default")))
#else
#define ORK_FAKE_EXPORT
#endif

typedef enum { ORK_FAKE_RKNPU = 0, ORK_FAKE_ROCKET = 1 } ork_fake_persona;
enum { ORK_FAKE_HANG = 1u, ORK_FAKE_NO_DEVICE = 2u, ORK_FAKE_DROP = 4u };

typedef struct ork_fake_kernel ork_fake_kernel;

typedef struct ork_fake_stats {
    uint64_t ioctls, submits, tasks, refused, live_bos, mapped, syncs;
} ork_fake_stats;

ork_status ork_fake_kernel_new(ork_fake_persona persona, ork_fake_kernel **out, ork_err *err);
/* the fake of a device backend's driver (rknpu, rocket); ORK_EINVAL for emu, which has no kernel driver */
ork_status ork_fake_kernel_for(ork_npu_backend_kind backend, ork_fake_kernel **out, ork_err *err);
void ork_fake_kernel_free(ork_fake_kernel *k); /* also reports leaks through stats before */
const ork_npu_sys *ork_fake_kernel_sys(ork_fake_kernel *k);
void ork_fake_kernel_set_faults(ork_fake_kernel *k, unsigned faults);
void ork_fake_kernel_get_stats(const ork_fake_kernel *k, ork_fake_stats *s);
const char *ork_fake_kernel_last_error(const ork_fake_kernel *k);
/* names of the calls made so far ("open", "RKNPU_MEM_CREATE", ...), newline separated, most recent last */
const char *ork_fake_kernel_trace(const ork_fake_kernel *k);
/* the table handed to the core (device.h "test kernels"): the shared library's one exported symbol */
ORK_FAKE_EXPORT const ork_npu_test_kernel *ork_npu_fake_kernel_table(void);
#endif
