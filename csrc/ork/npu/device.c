/* device.c - see device.h. */
#include "device.h"

#include <stdatomic.h>

static _Atomic(const ork_npu_test_kernel *) g_test_kernel = NULL;

ork_status ork_npu_test_kernel_install(const ork_npu_test_kernel *k, ork_err *err) {
    if (k && (k->abi != ORK_NPU_TEST_KERNEL_ABI || k->size != sizeof *k || !k->open || !k->free || !k->set_faults ||
              !k->get_stats || !k->last_error || !k->trace))
        return ork_err_set(err, ORK_EINVAL, "npu: the test kernel table has ABI %u / size %u, this build expects %u / %zu",
                           k->abi, k->size, ORK_NPU_TEST_KERNEL_ABI, sizeof *k);
    atomic_store(&g_test_kernel, k);
    return ORK_OK;
}

const ork_npu_test_kernel *ork_npu_test_kernel_installed(void) { return atomic_load(&g_test_kernel); }

ork_status ork_npu_test_kernel_open(ork_npu_backend_kind kind, const ork_npu_test_kernel **k, void **fake,
                                    const ork_npu_sys **sys, ork_err *err) {
    *k = NULL;
    *fake = NULL;
    *sys = NULL;
    if (kind != ORK_NPU_BE_RKNPU && kind != ORK_NPU_BE_ROCKET)
        return ork_err_set(err, ORK_EINVAL, "npu: the %s backend has no kernel driver to fake",
                           (int)kind >= 0 && (int)kind < ORK_NPU_BE_COUNT ? ork_npu_backend_names[kind] : "unknown");
    const ork_npu_test_kernel *t = atomic_load(&g_test_kernel);
    if (!t)
        return ork_err_set(err, ORK_EUNAVAIL,
                           "npu: fake_kernel is test machinery that the shipped extension does not contain: build "
                           "tests/npu_fake (tests/cbuild.py build_fake_kernel) and load it with "
                           "orkpy.npu.load_fake_kernel(path) first");
    ork_status st = t->open(kind, fake, sys, err);
    if (st == ORK_OK) *k = t;
    return st;
}
