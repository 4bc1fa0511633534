/* py_npu_device.c - orkpy._core.NPUDevice / NPUWeight / NPUJob over the core's NPU device
 * (csrc/ork/npu/device.h), which owns the open backend, its lock, the uploaded weights, the
 * planned-once jobs, the forward pass's per-weight job cache and the fake kernel of the tests.
 * Same shape as every binding (module.c): parse, coerce, release the GIL, call the core, map the
 * status; every function that holds references ends at one cleanup label. */
#include "numpy_api.h"

#include <string.h>

#include "../ork/npu/device.h"
#include "../ork/pack.h"
#include "bindings.h"
#include "errors.h"

/* ---------------------------------------------------------- NPUDevice --- *
 * The objects wrap the core's device, weights and jobs (csrc/ork/npu/device.h), which own the
 * lock, the buffers, the job cache and the fake kernel; each object keeps what it borrows alive
 * (a weight its device, a job its device and weights). Every core call that takes the device's
 * lock runs without the GIL (a device runs one matmul at a time, for up to timeout_ms: a thread
 * waiting for it must not stop the interpreter), and the binding checks nothing the core checks
 * under its lock (a closed device, a weight of another device); with the GIL held it only reads
 * what a weight or job was made with (device.h: no lock). */
typedef struct {
    PyObject_HEAD
    ork_npu_device *d;
} DevObject;

typedef struct WeightObject {
    PyObject_HEAD
    DevObject *owner; /* strong reference */
    ork_npu_dweight *w;
} WeightObject;

/* a job planned once; holds its device and weights */
typedef struct JobObject {
    PyObject_HEAD
    DevObject *owner;  /* strong reference */
    PyObject *weights; /* tuple of WeightObject, strong references (the job borrows their buffers) */
    ork_npu_djob *j;
} JobObject;

static PyTypeObject DevType, WeightType, JobType;

static int dev_init(DevObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"backend", "fake_kernel", "emu_base", "timeout_ms", NULL};
    const char *be, *fake = NULL;
    long long base = 0, tmo = 10000;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|zLL:NPUDevice", kwlist, &be, &fake, &base, &tmo)) return -1;
    if (self->d) {
        PyErr_SetString(PyExc_RuntimeError, "an NPUDevice is initialised once (open a new one)");
        return -1;
    }
    uint32_t ebase, t;
    ork_npu_backend_kind k;
    if (orkpy_u32_arg(base, "emu_base", &ebase) || orkpy_u32_arg(tmo, "timeout_ms", &t) || orkpy_npu_backend_arg(be, &k) < 0) return -1;
    if (fake && strcmp(fake, be)) {
        PyErr_Format(PyExc_ValueError, "fake_kernel must name the device backend ('%s'), got '%s'", be, fake);
        return -1;
    }
    ork_err err;
    err.msg[0] = 0;
    ork_status st;
    ork_npu_device *d = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = ork_npu_device_open(k, fake != NULL, ebase, t, &d, &err);
    Py_END_ALLOW_THREADS
    if (st) {
        orkpy_raise(st, &err);
        return -1;
    }
    self->d = d;
    return 0;
}

static void dev_dealloc(DevObject *self) {
    ork_npu_device_free(self->d); /* no weight or job is left: each holds a reference to its device */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 0 when the object holds a core device (it was initialised), else -1 with "the NPU device is closed"; whether
 * the device is still open is the core's check, made under its lock by every call */
static int dev_check(DevObject *self) {
    if (self->d) return 0;
    PyErr_SetString(PyExc_ValueError, "the NPU device is closed");
    return -1;
}

static PyObject *new_weight(DevObject *self) {
    WeightObject *w = PyObject_New(WeightObject, &WeightType);
    if (!w) return NULL;
    w->w = NULL;
    Py_INCREF(self);
    w->owner = self;
    return (PyObject *)w;
}

/* the end of an upload: the new NPUWeight, or NULL with the status raised */
static PyObject *finish_upload(WeightObject *w, ork_status st, const ork_err *err) {
    if (st) {
        Py_DECREF(w);
        return orkpy_raise(st, err);
    }
    return (PyObject *)w;
}

/* upload(B int8 (N, K), max_m=0, max_k=0, max_n=0, precision="int8") -> NPUWeight */
static PyObject *dev_upload(DevObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"B", "max_m", "max_k", "max_n", "precision", NULL};
    PyObject *obj;
    long long mm = 0, mk = 0, mn = 0;
    const char *prec = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|LLLz:upload", kwlist, &obj, &mm, &mk, &mn, &prec) || dev_check(self))
        return NULL;
    ork_npu_plan_opts o;
    if (orkpy_npu_caps_arg(mm, mk, mn, &o) || orkpy_npu_prec_arg(prec, &o)) return NULL;
    PyArrayObject *b = NULL;
    PyObject *result = NULL;
    if (!(b = orkpy_as_exact(obj, NPY_INT8, 2, "B"))) goto done;
    npy_intp N = PyArray_DIM(b, 0), K = PyArray_DIM(b, 1);
    if (N <= 0 || K <= 0 || N > 0xffffffffLL || K > 0xffffffffLL) {
        PyErr_Format(PyExc_ValueError, "B must be a non-empty (N, K) int8 matrix");
        goto done;
    }
    WeightObject *w = (WeightObject *)new_weight(self);
    if (!w) goto done;
    ork_err err;
    err.msg[0] = 0;
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_npu_device_upload_i8(self->d, (const int8_t *)PyArray_DATA(b), (uint32_t)N, (uint32_t)K, &o, &w->w, &err);
    Py_END_ALLOW_THREADS
    result = finish_upload(w, st, &err);
done:
    Py_XDECREF(b);
    return result;
}

/* upload_packed(kind, store uint8 1-D, lut int8 (16,), N, K, max_m=0, max_k=0, max_n=0, precision="int8",
 * group=0) -> NPUWeight (int4: device.h ork_npu_device_upload_store; group: plan.h opts.group) */
static PyObject *dev_upload_packed(DevObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"kind", "store", "lut", "N", "K", "max_m", "max_k", "max_n", "precision", "group", NULL};
    const char *ks, *prec = NULL;
    PyObject *so, *lo;
    long long N, K, mm = 0, mk = 0, mn = 0, grp = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sOOLL|LLLzL:upload_packed", kwlist, &ks, &so, &lo, &N, &K, &mm, &mk,
                                     &mn, &prec, &grp) ||
        dev_check(self))
        return NULL;
    const ork_kind_info *ki = orkpy_parse_kind(ks);
    ork_npu_plan_opts o;
    uint32_t n, k;
    if (!ki || orkpy_u32_arg(N, "N", &n) || orkpy_u32_arg(K, "K", &k) || orkpy_npu_caps_arg(mm, mk, mn, &o) ||
        orkpy_npu_prec_arg(prec, &o) || orkpy_u32_arg(grp, "group", &o.group))
        return NULL;
    PyArrayObject *s = NULL, *l = NULL;
    PyObject *result = NULL;
    if (!(s = orkpy_as_exact(so, NPY_UINT8, 1, "store")) || !(l = orkpy_as_exact(lo, NPY_INT8, 1, "lut"))) goto done;
    size_t need = ork_pack_store_bytes(ki->id, n, k);
    if (n == 0 || k == 0 || (size_t)PyArray_DIM(s, 0) != need || PyArray_DIM(l, 0) != 16) {
        PyErr_Format(PyExc_ValueError, "store must have %zu bytes for a %s (%u, %u) weight and lut 16 entries", need, ks,
                     n, k);
        goto done;
    }
    WeightObject *w = (WeightObject *)new_weight(self);
    if (!w) goto done;
    ork_err err;
    err.msg[0] = 0;
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_npu_device_upload_store(self->d, ki->id, PyArray_DATA(s), (const int8_t *)PyArray_DATA(l), n, k, &o, &w->w,
                                     &err);
    Py_END_ALLOW_THREADS
    result = finish_upload(w, st, &err);
done:
    Py_XDECREF(s);
    Py_XDECREF(l);
    return result;
}

/* matmul(weight, A int8 (M, K)) -> int32 (M, N), or (G, M, N) per-group partial sums for a grouped upload */
static PyObject *dev_matmul(DevObject *self, PyObject *args) {
    PyObject *wo, *ao;
    if (!PyArg_ParseTuple(args, "O!O:matmul", &WeightType, &wo, &ao) || dev_check(self)) return NULL;
    WeightObject *w = (WeightObject *)wo;
    uint32_t N, K;
    ork_npu_dweight_shape(w->w, &N, &K);
    PyArrayObject *a = NULL, *c = NULL;
    PyObject *result = NULL;
    if (!(a = orkpy_as_exact(ao, NPY_INT8, 2, "A"))) goto done;
    npy_intp M = PyArray_DIM(a, 0);
    if (PyArray_DIM(a, 1) != (npy_intp)K || M <= 0 || M > (npy_intp)ORK_NPU_MAX_TOTAL_M) {
        PyErr_Format(PyExc_ValueError, "A must be (M, %u) int8 with 1 <= M <= %u, got (%zd, %zd)", K, ORK_NPU_MAX_TOTAL_M,
                     (Py_ssize_t)M, (Py_ssize_t)PyArray_DIM(a, 1));
        goto done;
    }
    const uint32_t G = ork_npu_dweight_groups(w->w);
    npy_intp dims[3] = {(npy_intp)G, M, (npy_intp)N};
    if (!(c = ork_npu_dweight_group(w->w) ? (PyArrayObject *)PyArray_SimpleNew(3, dims, NPY_INT32)
                                          : (PyArrayObject *)PyArray_SimpleNew(2, dims + 1, NPY_INT32)))
        goto done;
    ork_err err;
    err.msg[0] = 0;
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_npu_device_matmul(self->d, w->w, (const int8_t *)PyArray_DATA(a), (uint32_t)M, (int32_t *)PyArray_DATA(c),
                               &err);
    Py_END_ALLOW_THREADS
    if (st) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = (PyObject *)c;
    c = NULL;
done:
    Py_XDECREF(a);
    Py_XDECREF(c);
    return result;
}

/* job(weights, M) -> NPUJob: the weights' matmuls at M rows chained, planned and emitted once */
static PyObject *dev_job(DevObject *self, PyObject *args) {
    PyObject *wo;
    long long M;
    if (!PyArg_ParseTuple(args, "OL:job", &wo, &M) || dev_check(self)) return NULL;
    if (M < 1 || M > (long long)ORK_NPU_MAX_TOTAL_M)
        return PyErr_Format(PyExc_ValueError, "M must be in [1, %u], got %lld", ORK_NPU_MAX_TOTAL_M, M);
    PyObject *tup = PySequence_Tuple(wo), *result = NULL;
    if (!tup) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(tup);
    ork_npu_dweight **ws = NULL;
    JobObject *j = NULL;
    if (n < 1 || n > 65536) {
        PyErr_Format(PyExc_ValueError, "a job needs 1 to 65536 weights, got %zd", n);
        goto done;
    }
    if (!(ws = (ork_npu_dweight **)PyMem_Malloc((size_t)n * sizeof *ws))) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyTuple_GET_ITEM(tup, i);
        if (!PyObject_TypeCheck(it, &WeightType)) {
            PyErr_Format(PyExc_TypeError, "weight %zd of the job is not an NPUWeight (upload it first)", i);
            goto done;
        }
        ws[i] = ((WeightObject *)it)->w;
    }
    if (!(j = PyObject_New(JobObject, &JobType))) goto done;
    j->j = NULL;
    Py_INCREF(self);
    j->owner = self;
    Py_INCREF(tup);
    j->weights = tup;
    ork_err err;
    err.msg[0] = 0;
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_npu_device_job(self->d, ws, (uint32_t)n, (uint32_t)M, &j->j, &err);
    Py_END_ALLOW_THREADS
    if (st) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = (PyObject *)j;
    j = NULL;
done:
    Py_XDECREF(j);
    PyMem_Free(ws);
    Py_DECREF(tup);
    return result;
}

static PyObject *dev_info(DevObject *self, PyObject *unused) {
    (void)unused;
    ork_npu_dev_info i;
    ork_err err;
    err.msg[0] = 0;
    if (dev_check(self)) return NULL;
    ork_npu_fake_report *rep = (ork_npu_fake_report *)PyMem_RawMalloc(sizeof *rep);
    if (!rep) return PyErr_NoMemory();
    ork_status st;
    int fake;
    Py_BEGIN_ALLOW_THREADS
    st = ork_npu_device_info(self->d, &i, &err);
    fake = st == ORK_OK && ork_npu_device_fake_report(self->d, rep);
    Py_END_ALLOW_THREADS
    PyObject *r = NULL, *f = NULL, *result = NULL;
    if (st) {
        orkpy_raise(st, &err);
        goto done;
    }
    r = Py_BuildValue("{s:s,s:s,s:s,s:K,s:K,s:K,s:K,s:K,s:I}", "backend", i.backend, "node", i.node, "sys", i.sys,
                      "submits", (unsigned long long)i.submits, "plans", (unsigned long long)i.plans, "tasks",
                      (unsigned long long)i.tasks, "bytes_to_device",
                      (unsigned long long)i.bytes_to_device, "bytes_from_device", (unsigned long long)i.bytes_from_device,
                      "timeout_ms", ork_npu_device_timeout_ms(self->d));
    if (!r) goto done;
    if (fake) {
        const ork_npu_fake_stats *s = &rep->stats;
        f = Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:s,s:s}", "ioctls", (unsigned long long)s->ioctls, "submits",
                          (unsigned long long)s->submits, "tasks", (unsigned long long)s->tasks, "refused",
                          (unsigned long long)s->refused, "live_bos", (unsigned long long)s->live_bos, "mapped",
                          (unsigned long long)s->mapped, "syncs", (unsigned long long)s->syncs, "last_error",
                          rep->last_error, "trace", rep->trace);
        if (!f || PyDict_SetItemString(r, "fake_kernel", f) < 0) goto done;
    }
    result = r;
    r = NULL;
done:
    PyMem_RawFree(rep);
    Py_XDECREF(r);
    Py_XDECREF(f);
    return result;
}

static PyObject *dev_set_faults(DevObject *self, PyObject *arg) {
    if (!self->d) return PyErr_Format(PyExc_ValueError, "set_faults needs a device opened on a fake kernel");
    unsigned long v = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred()) return NULL;
    ork_err err;
    err.msg[0] = 0;
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_npu_device_set_faults(self->d, (unsigned)v, &err);
    Py_END_ALLOW_THREADS
    if (st) return orkpy_raise(st, &err);
    Py_RETURN_NONE;
}

static PyObject *dev_close(DevObject *self, PyObject *unused) {
    (void)unused;
    if (self->d) {
        Py_BEGIN_ALLOW_THREADS
        ork_npu_device_close(self->d);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyMethodDef dev_methods[] = {
    {"upload", (PyCFunction)(void (*)(void))dev_upload, METH_VARARGS | METH_KEYWORDS,
     "upload(B int8 (N, K), max_m=0, max_k=0, max_n=0, precision='int8') -> NPUWeight resident on the device"},
    {"upload_packed", (PyCFunction)(void (*)(void))dev_upload_packed, METH_VARARGS | METH_KEYWORDS,
     "upload_packed(kind, store, lut, N, K, ..., precision='int8') -> NPUWeight from a PackedWeight tile store"},
    {"matmul", (PyCFunction)dev_matmul, METH_VARARGS, "matmul(weight, A int8 (M, K)) -> int32 (M, N)"},
    {"job", (PyCFunction)dev_job, METH_VARARGS,
     "job(weights, M) -> NPUJob: the weights' matmuls at M rows, chained into one submit, planned once"},
    {"info", (PyCFunction)dev_info, METH_NOARGS, "-> dict: backend, node, counters (+ fake kernel state)"},
    {"set_faults", (PyCFunction)dev_set_faults, METH_O, "set_faults(bits): inject faults into the fake kernel"},
    {"close", (PyCFunction)dev_close, METH_NOARGS, "release the device (weights become unusable)"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject DevType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "orkpy._core.NPUDevice",
    .tp_basicsize = sizeof(DevObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "NPUDevice(backend, fake_kernel=None, emu_base=0, timeout_ms=10000): an open NPU backend",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)dev_init,
    .tp_dealloc = (destructor)dev_dealloc,
    .tp_methods = dev_methods,
};

static void weight_dealloc(WeightObject *self) {
    if (self->w) {
        Py_BEGIN_ALLOW_THREADS
        ork_npu_dweight_release(self->w);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(self->owner);
    PyObject_Free(self);
}

static PyObject *weight_shape(WeightObject *self, void *c) {
    (void)c;
    uint32_t N, K;
    ork_npu_dweight_shape(self->w, &N, &K);
    return Py_BuildValue("(II)", N, K);
}
static PyObject *weight_addr(WeightObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLong(ork_npu_dweight_addr(self->w));
}
static PyObject *weight_nbytes(WeightObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLongLong(ork_npu_dweight_nbytes(self->w));
}
static PyObject *weight_group(WeightObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLong(ork_npu_dweight_group(self->w));
}
static PyObject *weight_precision(WeightObject *self, void *c) {
    (void)c;
    return PyUnicode_FromString(ork_npu_dweight_precision(self->w) == ORK_NPU_PREC_INT4 ? "int4" : "int8");
}

/* the row counts M the model hook holds a planned-once job for, in slot order */
static PyObject *weight_job_rows(WeightObject *self, void *c) {
    (void)c;
    uint32_t m[ORK_NPU_JOB_CACHE_SLOTS];
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = ork_npu_dweight_job_rows(self->w, m);
    Py_END_ALLOW_THREADS
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLong(m[i]);
        if (!v) Py_CLEAR(t);
        else PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyGetSetDef weight_getset[] = {{"shape", (getter)weight_shape, NULL, "(N, K)", NULL},
                                      {"job_rows", (getter)weight_job_rows, NULL,
                                       "row counts M the model's NPU hook runs as cached planned-once jobs", NULL},
                                      {"npu_address", (getter)weight_addr, NULL, "32-bit NPU address", NULL},
                                      {"nbytes", (getter)weight_nbytes, NULL, "device buffer bytes", NULL},
                                      {"group", (getter)weight_group, NULL,
                                       "group size of group-wise partial sums (matmul returns (G, M, N)); 0: per "
                                       "channel", NULL},
                                      {"precision", (getter)weight_precision, NULL,
                                       "'int8' or 'int4' (resident in the int4 layout, half a byte a weight)", NULL},
                                      {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject WeightType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "orkpy._core.NPUWeight",
    .tp_basicsize = sizeof(WeightObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A weight matrix resident in an NPU device buffer (made by NPUDevice.upload*)",
    .tp_dealloc = (destructor)weight_dealloc,
    .tp_getset = weight_getset,
};

/* ------------------------------------------------------------ NPUJob --- */
static void job_dealloc(JobObject *self) {
    if (self->j) {
        Py_BEGIN_ALLOW_THREADS
        ork_npu_djob_release(self->j);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(self->weights);
    Py_XDECREF(self->owner);
    PyObject_Free(self);
}

/* run(inputs: sequence of n int8 (M, K_i)) -> list of n int32 (M, N_i), one submit */
static PyObject *job_run(JobObject *self, PyObject *arg) {
    const uint32_t n = ork_npu_djob_n(self->j), M = ork_npu_djob_M(self->j);
    PyObject *seq = PySequence_Fast(arg, "inputs must be a sequence of int8 (M, K) arrays"), *outs = NULL, *result = NULL;
    if (!seq) return NULL;
    PyArrayObject **in = (PyArrayObject **)PyMem_Calloc(n, sizeof *in);
    void **ptr = (void **)PyMem_Calloc((size_t)2 * n, sizeof *ptr);
    size_t *lda = (size_t *)PyMem_Calloc(n, sizeof *lda);
    if (!in || !ptr || !lda) {
        PyErr_NoMemory();
        goto done;
    }
    if (PySequence_Fast_GET_SIZE(seq) != (Py_ssize_t)n) {
        PyErr_Format(PyExc_ValueError, "the job has %u matmuls but got %zd inputs", n, PySequence_Fast_GET_SIZE(seq));
        goto done;
    }
    if (!(outs = PyList_New(n))) goto done;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t N, K;
        ork_npu_dweight_shape(((WeightObject *)PyTuple_GET_ITEM(self->weights, i))->w, &N, &K);
        if (!(in[i] = orkpy_as_exact(PySequence_Fast_GET_ITEM(seq, i), NPY_INT8, 2, "A"))) goto done;
        if (PyArray_DIM(in[i], 0) != (npy_intp)M || PyArray_DIM(in[i], 1) != (npy_intp)K) {
            PyErr_Format(PyExc_ValueError, "input %u of the job must be (%u, %u) int8, got (%zd, %zd)", i, M, K,
                         (Py_ssize_t)PyArray_DIM(in[i], 0), (Py_ssize_t)PyArray_DIM(in[i], 1));
            goto done;
        }
        npy_intp dims[2] = {(npy_intp)M, (npy_intp)N};
        PyObject *c = PyArray_SimpleNew(2, dims, NPY_INT32);
        if (!c) goto done;
        PyList_SET_ITEM(outs, i, c);
        ptr[i] = PyArray_DATA(in[i]);
        ptr[n + i] = PyArray_DATA((PyArrayObject *)c);
        lda[i] = K;
    }
    ork_err err;
    err.msg[0] = 0;
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_npu_djob_run(self->j, (const int8_t *const *)ptr, lda, (int32_t *const *)(ptr + n), &err);
    Py_END_ALLOW_THREADS
    if (st) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = outs;
    outs = NULL;
done:
    for (uint32_t i = 0; in && i < n; i++) Py_XDECREF(in[i]);
    PyMem_Free(in);
    PyMem_Free(ptr);
    PyMem_Free(lda);
    Py_XDECREF(outs);
    Py_DECREF(seq);
    return result;
}

static PyObject *job_get(JobObject *self, void *what) {
    switch ((int)(intptr_t)what) {
    case 0: return PyLong_FromUnsignedLong(ork_npu_djob_M(self->j));
    case 1: return PyLong_FromUnsignedLong(ork_npu_djob_tasks(self->j));
    case 2: return PyLong_FromUnsignedLongLong(ork_npu_djob_cmd_bytes(self->j));
    default: Py_INCREF(self->weights); return self->weights;
    }
}

static PyMethodDef job_methods[] = {
    {"run", (PyCFunction)job_run, METH_O, "run(inputs: n int8 (M, K_i)) -> n int32 (M, N_i), one submit"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef job_getset[] = {{"M", (getter)job_get, NULL, "rows of every matmul", (void *)0},
                                   {"n_tasks", (getter)job_get, NULL, "NPU tasks in the chain (one submit)", (void *)1},
                                   {"cmd_bytes", (getter)job_get, NULL, "bytes of the chained command buffer", (void *)2},
                                   {"weights", (getter)job_get, NULL, "the job's NPUWeights, in chain order", (void *)3},
                                   {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject JobType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "orkpy._core.NPUJob",
    .tp_basicsize = sizeof(JobObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Matmuls of resident weights chained into one submit, planned and emitted once (NPUDevice.job)",
    .tp_dealloc = (destructor)job_dealloc,
    .tp_methods = job_methods,
    .tp_getset = job_getset,
};

ork_npu_dweight *orkpy_npu_weight_of(PyObject *obj) {
    if (!PyObject_TypeCheck(obj, &WeightType)) {
        PyErr_SetString(PyExc_TypeError, "expected an orkpy._core.NPUWeight");
        return NULL;
    }
    return ((WeightObject *)obj)->w;
}

int orkpy_npu_init(PyObject *module) {
    if (PyType_Ready(&DevType) < 0 || PyType_Ready(&WeightType) < 0 || PyType_Ready(&JobType) < 0) return -1;
    if (PyModule_AddObjectRef(module, "NPUDevice", (PyObject *)&DevType) < 0) return -1;
    if (PyModule_AddObjectRef(module, "NPUWeight", (PyObject *)&WeightType) < 0) return -1;
    if (PyModule_AddObjectRef(module, "NPUJob", (PyObject *)&JobType) < 0) return -1;
    return 0;
}
