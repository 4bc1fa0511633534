/* device.h - the NPU device as the runtime owns it: an open backend
 * (backend.h) with its lock, its uploaded weights, the planned-once jobs and
 * the per-weight job cache of the forward pass's hook; and the test-only
 * hook through which the tests hand the core a fake kernel driver.
 */
#ifndef ORK_NPU_DEVICE_H
#define ORK_NPU_DEVICE_H

#include <stddef.h>
#include <stdint.h>

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

#endif
