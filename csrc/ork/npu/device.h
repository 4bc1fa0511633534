/* device.h - the NPU device as the runtime owns it: an open backend
 * (backend.h) with its lock, its uploaded weights, the planned-once jobs and
 * the per-weight job cache of the forward pass's hook; and the test-only
 * hook through which the tests hand the core a fake kernel driver.
 *
 * Thread safety: every function that reads or changes the device's state
 * takes the device's lock (a pthread mutex) itself, so callers (the binding,
 * with the GIL released; the forward pass's hook, from any thread) never lock;
 * a caller that must not wait (the binding holding the GIL) calls them without
 * the GIL. What a weight or a job was made with (shape, address, sizes, row
 * count) is fixed before it is handed out: those getters take no lock, return
 * the values as made also after a close, and may be called with the GIL held.
 * Lifetimes: a weight and a job belong to
 * their device and are released by their owner (the binding's objects, which
 * keep the device alive until then); closing the device frees every device
 * buffer at once, and a released weight or job afterwards frees host memory
 * only. ork_npu_device_free comes after every weight and job was released.
 */
#ifndef ORK_NPU_DEVICE_H
#define ORK_NPU_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "../linear.h"
#include "../status.h"
#include "backend.h"

/* ------------------------------------------------ test kernels (tests only) --
 * The shipped extension holds no fake kernel driver. The tests build one
 * (tests/npu_fake/fake_kernel.c, by tests/cbuild.py build_fake_kernel) into a
 * small shared library whose one exported symbol, ork_npu_fake_kernel_table(),
 * returns a table of this shape; ork_npu_test_kernel_install hands it to the
 * core (the binding's test-only _core._npu_install_fake_kernel_for_tests), and
 * from then on a device opened with a fake kernel gets a fresh fake of its
 * backend's driver. Without it such a device is refused (ORK_EUNAVAIL naming
 * the library). The table must stay valid for the life of the process. */
#define ORK_NPU_TEST_KERNEL_ABI 1

typedef struct ork_npu_fake_stats {
    uint64_t ioctls, submits, tasks, refused, live_bos, mapped, syncs;
} ork_npu_fake_stats;

typedef struct ork_npu_test_kernel {
    uint32_t abi;  /* ORK_NPU_TEST_KERNEL_ABI */
    uint32_t size; /* sizeof(ork_npu_test_kernel) */
    /* a new fake of `backend`'s driver (ORK_EINVAL for emu, which has none) and its system-call table */
    ork_status (*open)(ork_npu_backend_kind backend, void **fake, const ork_npu_sys **sys, ork_err *err);
    void (*free)(void *fake);
    void (*set_faults)(void *fake, unsigned faults);
    void (*get_stats)(const void *fake, ork_npu_fake_stats *s);
    const char *(*last_error)(const void *fake);
    const char *(*trace)(const void *fake);
} ork_npu_test_kernel;

/* Install the test kernel table (NULL uninstalls); ORK_EINVAL for a table of another ABI or size. */
ork_status ork_npu_test_kernel_install(const ork_npu_test_kernel *k, ork_err *err);
/* the installed table, or NULL */
const ork_npu_test_kernel *ork_npu_test_kernel_installed(void);
/* A fake of `kind`'s driver from the installed table: ORK_EINVAL for emu ("no kernel driver to fake"),
 * ORK_EUNAVAIL when no table is installed. */
ork_status ork_npu_test_kernel_open(ork_npu_backend_kind kind, const ork_npu_test_kernel **k, void **fake,
                                    const ork_npu_sys **sys, ork_err *err);

/* ------------------------------------------------------------ devices --- */
/* The model hook keeps per weight a few single-weight jobs (backend.h ork_npu_job) keyed by the row
 * count M: made the first time the weight runs at that M, then reused (no planning, no emission, one
 * submit per call). Only small M are cached, the KV-cached decode (M = 1, or a few rows): at most
 * ORK_NPU_JOB_CACHE_SLOTS Ms per weight, first come; a larger M or a full cache plans per call
 * (ork_npu_matmul). A prefill's many rows amortize its plan, and each job owns command / input / output
 * buffers sized for its M: caching M = 512 for every linear of a 1.7B model would hold GBs of device
 * memory (the lm_head's output alone is 512 x 151936 x 4 bytes). */
#define ORK_NPU_JOB_CACHE_MAX_M 8
#define ORK_NPU_JOB_CACHE_SLOTS 4

typedef struct ork_npu_device ork_npu_device;
typedef struct ork_npu_dweight ork_npu_dweight; /* a weight resident on a device */
typedef struct ork_npu_djob ork_npu_djob;       /* a planned-once job of a device's weights */

/* fake: open the backend on a fake kernel of the test library (ork_npu_test_kernel_open), else on the real
 * system; emu_base: the emu backend's first NPU address (backend.h); timeout_ms > 0 for every submit. */
ork_status ork_npu_device_open(ork_npu_backend_kind kind, int fake, uint32_t emu_base, uint32_t timeout_ms,
                               ork_npu_device **out, ork_err *err);
/* free every job's and weight's device buffers and close the backend (the fake kernel stays, for its report) */
void ork_npu_device_close(ork_npu_device *d);
void ork_npu_device_free(ork_npu_device *d); /* after every weight and job was released; NULL is a no-op */
int ork_npu_device_is_open(ork_npu_device *d);
uint32_t ork_npu_device_timeout_ms(const ork_npu_device *d); /* as opened (no lock) */
/* counters (backend "closed" once closed); ORK_EINVAL "the NPU device is closed" when closed without a fake */
ork_status ork_npu_device_info(ork_npu_device *d, ork_npu_dev_info *info, ork_err *err);

/* the fake kernel's state, copied under the lock */
typedef struct ork_npu_fake_report {
    ork_npu_fake_stats stats;
    char last_error[256];
    char trace[16384]; /* the call names, newline separated, most recent last */
} ork_npu_fake_report;
/* 1 with *r filled when the device runs on a fake kernel, else 0 */
int ork_npu_device_fake_report(ork_npu_device *d, ork_npu_fake_report *r);
/* inject faults into the fake kernel; ORK_EINVAL when the device has none */
ork_status ork_npu_device_set_faults(ork_npu_device *d, unsigned faults, ork_err *err);

/* upload an int8 (N, K) matrix (row stride K) / a packed tile store of `kind` (pack.h; lut for 4-bit kinds).
 * At precision int4 (opts->precision): a matrix holds int4 codes and its matmuls take int4 activation codes;
 * a store must be of an integer kind whose codes fit int4 (w4a4, w4a8: ORK_EINVAL otherwise), resident in the
 * int4 layout (half a byte a weight), and its matmuls take int8 codes in [-128, 119]: a row whose codes fit
 * [-8, 7] runs as one int4 row, any other as two int4 digit rows combined in int32 (quant.h "w4a8"), so
 * every matmul, the forward pass's hook included, returns the exact int32 product the CPU kernels give. */
ork_status ork_npu_device_upload_i8(ork_npu_device *d, const int8_t *B, uint32_t N, uint32_t K,
                                    const ork_npu_plan_opts *opts, ork_npu_dweight **out, ork_err *err);
ork_status ork_npu_device_upload_store(ork_npu_device *d, ork_kind kind, const void *store, const int8_t lut[16],
                                       uint32_t N, uint32_t K, const ork_npu_plan_opts *opts, ork_npu_dweight **out,
                                       ork_err *err);
/* free the weight (its cached jobs, then its device buffer when the device is open); NULL is a no-op */
void ork_npu_dweight_release(ork_npu_dweight *w);
/* 1 when w is live on d (d open and w not freed by a close) */
int ork_npu_dweight_on(ork_npu_dweight *w, ork_npu_device *d);
/* The forward pass's hook of w (ork_npu_dweight_int_mm below, ctx = w), its shape and group size (0, or
 * the upload's opts.group: the hook returns (G, M, N) partial sums, linear.h "int_mm"), to route a linear
 * through (runtime.h ork_runtime_set_int_mm); ORK_EINVAL "the NPU weight's device is closed" when w is not
 * live. A close after the call ends the route's forwards with ORK_EINVAL (ork_npu_dweight_int_mm). */
ork_status ork_npu_dweight_hook(ork_npu_dweight *w, ork_int_mm_fn *fn, void **ctx, size_t *N, size_t *K,
                                size_t *group, ork_err *err);
/* as uploaded (no lock) */
void ork_npu_dweight_shape(const ork_npu_dweight *w, uint32_t *N, uint32_t *K);
uint32_t ork_npu_dweight_addr(const ork_npu_dweight *w);    /* 32-bit NPU address */
uint64_t ork_npu_dweight_nbytes(const ork_npu_dweight *w);  /* device buffer bytes */
ork_npu_precision ork_npu_dweight_precision(const ork_npu_dweight *w); /* int8, or int4 (the int4 layout) */
uint32_t ork_npu_dweight_group(const ork_npu_dweight *w);  /* opts.group of the upload (0: per channel) */
uint32_t ork_npu_dweight_groups(const ork_npu_dweight *w); /* G = ceil(K / group) blocks per matmul, else 1 */
/* the row counts M the forward pass's hook holds a cached job for, in slot order; returns how many */
int ork_npu_dweight_job_rows(ork_npu_dweight *w, uint32_t m[ORK_NPU_JOB_CACHE_SLOTS]);

/* C (M, N) int32 = A (M, K) int8 (row stride K) times w, on d (w must be live on d); (G, M, N) for a
 * grouped upload (ork_npu_dweight_groups) */
ork_status ork_npu_device_matmul(ork_npu_device *d, ork_npu_dweight *w, const int8_t *A, uint32_t M, int32_t *C,
                                 ork_err *err);

/* a job of n weights (each live on d) at M rows (backend.h ork_npu_job); not of an int4 store's weight
 * (its digit rows) nor of a grouped one (ORK_EINVAL) */
ork_status ork_npu_device_job(ork_npu_device *d, ork_npu_dweight *const *w, uint32_t n, uint32_t M,
                              ork_npu_djob **out, ork_err *err);
/* C[i] (M, N_i) = A[i] (M, K_i) (row stride lda[i]) times weight i, one submit; ORK_EINVAL once the device closed */
ork_status ork_npu_djob_run(ork_npu_djob *j, const int8_t *const *A, const size_t *lda, int32_t *const *C,
                            ork_err *err);
void ork_npu_djob_release(ork_npu_djob *j); /* NULL is a no-op */
int ork_npu_djob_live(ork_npu_djob *j);     /* 0 once its device closed */
/* as planned (no lock) */
uint32_t ork_npu_djob_n(const ork_npu_djob *j);
uint32_t ork_npu_djob_M(const ork_npu_djob *j);
uint32_t ork_npu_djob_tasks(const ork_npu_djob *j);
uint64_t ork_npu_djob_cmd_bytes(const ork_npu_djob *j);

/* The forward pass's hook (linear.h ork_int_mm_fn; ctx = an ork_npu_dweight): the integer matmul of a
 * packed linear on the weight's device (int4 weights as ork_npu_device_upload_store says), through the
 * weight's cached job at the call's row count (digit rows included; decode) or planned for this call. Both give the
 * same int32 products. */
ork_status ork_npu_dweight_int_mm(void *ctx, const int8_t *xq, size_t M, size_t ldq, int32_t *acc, ork_err *err);


#endif
