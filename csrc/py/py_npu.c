/* py_npu.c - binding of the NPU register-command slice (csrc/ork/npu/regcmd.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL orkpy_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <string.h>

#include "../ork/npu/regcmd.h"
#include "bindings.h"
#include "errors.h"

PyObject *orkpy_npu_matmul_task(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"dtype", "M", "K", "N", "in_addr", "w_addr", "out_addr", NULL};
    const char *dt;
    unsigned long long M, K, N, in_a, w_a, out_a;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sKKKKKK:npu_matmul_task", kwlist, &dt, &M, &K, &N, &in_a, &w_a, &out_a))
        return NULL;
    ork_npu_matmul d;
    if (strcmp(dt, "int8") == 0) d.dtype = ORK_NPU_INT8_INT32;
    else if (strcmp(dt, "fp16") == 0) d.dtype = ORK_NPU_FP16_FP32;
    else return PyErr_Format(PyExc_ValueError, "dtype must be 'int8' (-> int32) or 'fp16' (-> fp32), got '%s'", dt);
    if (M > 0xffffffffULL || K > 0xffffffffULL || N > 0xffffffffULL || in_a > 0xffffffffULL || w_a > 0xffffffffULL ||
        out_a > 0xffffffffULL)
        return PyErr_Format(PyExc_ValueError, "sizes and NPU addresses must fit in 32 bits");
    d.M = (uint32_t)M;
    d.K = (uint32_t)K;
    d.N = (uint32_t)N;
    d.in_addr = (uint32_t)in_a;
    d.w_addr = (uint32_t)w_a;
    d.out_addr = (uint32_t)out_a;
    npy_intp n = ORK_NPU_TASK_QWORDS;
    PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_UINT64);
    if (!a) return NULL;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_npu_matmul_task(&d, (uint64_t *)PyArray_DATA(a), &err);
    if (st != ORK_OK) {
        Py_DECREF(a);
        return orkpy_raise(st, &err);
    }
    return (PyObject *)a;
}

PyObject *orkpy_npu_names(PyObject *self, PyObject *args) {
    (void)self;
    unsigned int target, reg;
    if (!PyArg_ParseTuple(args, "II:npu_names", &target, &reg)) return NULL;
    const char *t = ork_npu_target_name(target), *r = ork_npu_reg_name(target, reg);
    return Py_BuildValue("(zz)", t, r);
}
