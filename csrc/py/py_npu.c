/* py_npu.c - binding of the NPU layer (csrc/ork/npu): register commands
 * (regcmd.h), the planner and operand layouts (plan.h), the emulator (emu.h)
 * and the NPUDevice / NPUWeight objects over the backends (backend.h), with
 * the fake kernel drivers of the tests' library (device.h, "test kernels"). Same shape as every
 * binding (module.c): parse, coerce, release the GIL, call the core, map the
 * status; every function that holds references ends at one cleanup label. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL orkpy_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <string.h>

#include "../ork/linear.h"
#include "../ork/npu/regcmd.h"
#include "../ork/pack.h"
#include "bindings.h"
#include "errors.h"

PyObject *orkpy_npu_matmul_task(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"dtype", "M", "K", "N", "in_addr", "w_addr", "out_addr", NULL};
    const char *dt;
    unsigned long long M, K, N, in_a, w_a, out_a;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sKKKKKK:npu_matmul_task", kwlist, &dt, &M, &K, &N, &in_a, &w_a, &out_a))
        return NULL;
    ork_npu_matmul_desc d;
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
    PyArrayObject *a = NULL;
    PyObject *result = NULL;
    if (!(a = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_UINT64))) goto done;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_npu_matmul_task(&d, (uint64_t *)PyArray_DATA(a), &err);
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = (PyObject *)a;
    a = NULL;
done:
    Py_XDECREF(a);
    return result;
}

PyObject *orkpy_npu_names(PyObject *self, PyObject *args) {
    (void)self;
    unsigned int target, reg;
    if (!PyArg_ParseTuple(args, "II:npu_names", &target, &reg)) return NULL;
    const char *t = ork_npu_target_name(target), *r = ork_npu_reg_name(target, reg);
    return Py_BuildValue("(zz)", t, r);
}

/* ------------------------------------------------------------------------
 * Planner, layouts and the emulator as functions; NPUDevice / NPUWeight
 * objects over csrc/ork/npu/device.h (which owns the device's lock).
 * ------------------------------------------------------------------------ */
#include "../ork/npu/backend.h"
#include "../ork/npu/emu.h"
#include "../ork/npu/device.h"
#include "../ork/npu/plan.h"

static int u32_arg(long long v, const char *name, uint32_t *out) {
    if (v < 0 || v > 0xffffffffLL) {
        PyErr_Format(PyExc_ValueError, "%s must be in [0, 2^32), got %lld", name, v);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* the per-task tile caps max_m, max_k, max_n (0 = hardware limit) */
static int caps_arg(long long mm, long long mk, long long mn, ork_npu_plan_opts *o) {
    return u32_arg(mm, "max_m", &o->max_m) || u32_arg(mk, "max_k", &o->max_k) || u32_arg(mn, "max_n", &o->max_n) ? -1
                                                                                                              : 0;
}

static int make_plan(long long M, long long K, long long N, long long mm, long long mk, long long mn, ork_npu_plan *p) {
    uint32_t m, k, n;
    ork_npu_plan_opts o;
    if (u32_arg(M, "M", &m) || u32_arg(K, "K", &k) || u32_arg(N, "N", &n) || caps_arg(mm, mk, mn, &o)) return -1;
    ork_err err;
    err.msg[0] = 0;
    ork_status st = ork_npu_plan_make(m, k, n, &o, p, &err);
    if (st) {
        orkpy_raise(st, &err);
        return -1;
    }
    return 0;
}

#define PLAN_KW "M", "K", "N", "max_m", "max_k", "max_n"

PyObject *orkpy_npu_plan(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {PLAN_KW, NULL};
    long long M, K, N, mm = 0, mk = 0, mn = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LLL|LLL:npu_plan", kwlist, &M, &K, &N, &mm, &mk, &mn)) return NULL;
    ork_npu_plan p;
    if (make_plan(M, K, N, mm, mk, mn, &p)) return NULL;
    PyObject *tasks = NULL, *result = NULL;
    if (!(tasks = PyList_New(p.n_tasks))) goto done;
    for (uint32_t t = 0; t < p.n_tasks; t++) {
        const ork_npu_task_desc *d = &p.tasks[t];
        PyObject *row = Py_BuildValue("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:K,s:K,s:K,s:K}", "m0", d->m0, "Mt", d->Mt, "Mp", d->Mp,
                                      "k0", d->k0, "Kt", d->Kt, "n0", d->n0, "Nt", d->Nt, "in_off",
                                      (unsigned long long)d->in_off, "w_off", (unsigned long long)d->w_off, "out_off",
                                      (unsigned long long)d->out_off, "cmd_off", (unsigned long long)d->cmd_off);
        if (!row) goto done;
        PyList_SET_ITEM(tasks, t, row);
    }
    result = Py_BuildValue("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:K,s:K,s:K,s:K,s:K,s:O}", "M", p.M, "K", p.K, "N", p.N,
                           "Kp", p.Kp, "Np", p.Np, "nm", p.nm, "nk", p.nk, "nn", p.nn, "n_tasks", p.n_tasks, "in_bytes",
                           (unsigned long long)p.in_bytes, "w_bytes", (unsigned long long)p.w_bytes, "out_bytes",
                           (unsigned long long)p.out_bytes, "cmd_bytes", (unsigned long long)p.cmd_bytes, "macs",
                           (unsigned long long)p.macs, "tasks", tasks);
done:
    Py_XDECREF(tasks);
    ork_npu_plan_free(&p);
    return result;
}

PyObject *orkpy_npu_plan_emit(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"M", "K", "N", "cmd_addr", "in_addr", "w_addr", "out_addr", "max_m", "max_k", "max_n", NULL};
    long long M, K, N, ca, ia, wa, oa, mm = 0, mk = 0, mn = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LLLLLLL|LLL:npu_plan_emit", kwlist, &M, &K, &N, &ca, &ia, &wa, &oa, &mm,
                                     &mk, &mn))
        return NULL;
    uint32_t c, i, w, o;
    if (u32_arg(ca, "cmd_addr", &c) || u32_arg(ia, "in_addr", &i) || u32_arg(wa, "w_addr", &w) ||
        u32_arg(oa, "out_addr", &o))
        return NULL;
    ork_npu_plan p;
    if (make_plan(M, K, N, mm, mk, mn, &p)) return NULL;
    npy_intp n = (npy_intp)(p.cmd_bytes / 8);
    PyArrayObject *a = NULL;
    PyObject *result = NULL;
    if (!(a = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_UINT64))) goto done;
    ork_err err;
    err.msg[0] = 0;
    ork_status st;
    uint64_t *q = (uint64_t *)PyArray_DATA(a);
    Py_BEGIN_ALLOW_THREADS
    st = ork_npu_plan_emit(&p, c, i, w, o, q, &err);
    Py_END_ALLOW_THREADS
    if (st) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = (PyObject *)a;
    a = NULL;
done:
    Py_XDECREF(a);
    ork_npu_plan_free(&p);
    return result;
}

/* shapes: a sequence of (M, K, N) -> a chain with the same caps for every matmul */
static int make_chain(PyObject *shapes, long long mm, long long mk, long long mn, ork_npu_chain *c) {
    ork_npu_plan_opts o;
    if (caps_arg(mm, mk, mn, &o)) return -1;
    PyObject *seq = PySequence_Fast(shapes, "shapes must be a sequence of (M, K, N)");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint32_t *d = n > 0 && n <= 65536 ? (uint32_t *)PyMem_Malloc((size_t)n * 3 * sizeof *d) : NULL;
    ork_npu_plan_opts *op = d ? (ork_npu_plan_opts *)PyMem_Malloc((size_t)n * sizeof *op) : NULL;
    int rc = -1;
    if (!op) {
        if (n <= 0 || n > 65536) PyErr_Format(PyExc_ValueError, "a chain needs 1 to 65536 matmuls, got %zd", n);
        else PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long M, K, N;
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(it)) {
            PyErr_SetString(PyExc_TypeError, "each shape must be a tuple (M, K, N)");
            goto done;
        }
        if (!PyArg_ParseTuple(it, "LLL;each shape must be (M, K, N)", &M, &K, &N) ||
            u32_arg(M, "M", &d[i]) || u32_arg(K, "K", &d[n + i]) || u32_arg(N, "N", &d[2 * n + i]))
            goto done;
        op[i] = o;
    }
    ork_err err;
    err.msg[0] = 0;
    ork_status st = ork_npu_chain_make((uint32_t)n, d, d + n, d + 2 * n, op, c, &err);
    if (st) orkpy_raise(st, &err);
    else rc = 0;
done:
    PyMem_Free(d);
    PyMem_Free(op);
    Py_DECREF(seq);
    return rc;
}

/* npu_chain_plan(shapes, max_m, max_k, max_n) -> dict: n_tasks, buffer sizes, per-matmul regions */
PyObject *orkpy_npu_chain_plan(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"shapes", "max_m", "max_k", "max_n", NULL};
    PyObject *shapes, *parts = NULL, *result = NULL;
    long long mm = 0, mk = 0, mn = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|LLL:npu_chain_plan", kwlist, &shapes, &mm, &mk, &mn)) return NULL;
    ork_npu_chain c;
    if (make_chain(shapes, mm, mk, mn, &c)) return NULL;
    if (!(parts = PyList_New(c.n))) goto done;
    for (uint32_t i = 0; i < c.n; i++) {
        const ork_npu_plan *p = &c.plans[i];
        PyObject *row = Py_BuildValue("{s:I,s:I,s:I,s:I,s:K,s:K,s:K,s:K,s:K,s:K}", "M", p->M, "K", p->K, "N", p->N,
                                      "n_tasks", p->n_tasks, "in_off", (unsigned long long)c.in_at[i], "out_off",
                                      (unsigned long long)c.out_at[i], "cmd_off", (unsigned long long)c.cmd_at[i],
                                      "in_bytes", (unsigned long long)p->in_bytes, "out_bytes",
                                      (unsigned long long)p->out_bytes, "w_bytes", (unsigned long long)p->w_bytes);
        if (!row) goto done;
        PyList_SET_ITEM(parts, i, row);
    }
    result = Py_BuildValue("{s:I,s:K,s:K,s:K,s:O}", "n_tasks", c.n_tasks, "in_bytes", (unsigned long long)c.in_bytes,
                           "out_bytes", (unsigned long long)c.out_bytes, "cmd_bytes", (unsigned long long)c.cmd_bytes,
                           "parts", parts);
done:
    Py_XDECREF(parts);
    ork_npu_chain_free(&c);
    return result;
}

/* npu_chain_emit(shapes, cmd_addr, in_addr, w_addrs, out_addr, max_m, max_k, max_n) -> uint64 commands */
PyObject *orkpy_npu_chain_emit(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"shapes", "cmd_addr", "in_addr", "w_addrs", "out_addr", "max_m", "max_k", "max_n", NULL};
    PyObject *shapes, *wobj, *wseq = NULL;
    long long ca, ia, oa, mm = 0, mk = 0, mn = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OLLOL|LLL:npu_chain_emit", kwlist, &shapes, &ca, &ia, &wobj, &oa, &mm, &mk,
                                     &mn))
        return NULL;
    uint32_t c_a, i_a, o_a;
    if (u32_arg(ca, "cmd_addr", &c_a) || u32_arg(ia, "in_addr", &i_a) || u32_arg(oa, "out_addr", &o_a)) return NULL;
    ork_npu_chain c;
    if (make_chain(shapes, mm, mk, mn, &c)) return NULL;
    PyArrayObject *a = NULL;
    PyObject *result = NULL;
    uint32_t *wa = NULL;
    if (!(wseq = PySequence_Fast(wobj, "w_addrs must be a sequence of NPU addresses"))) goto done;
    if (PySequence_Fast_GET_SIZE(wseq) != (Py_ssize_t)c.n) {
        PyErr_Format(PyExc_ValueError, "w_addrs has %zd addresses for %u matmuls", PySequence_Fast_GET_SIZE(wseq), c.n);
        goto done;
    }
    if (!(wa = (uint32_t *)PyMem_Malloc((size_t)c.n * sizeof *wa))) {
        PyErr_NoMemory();
        goto done;
    }
    for (uint32_t i = 0; i < c.n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(wseq, i));
        if ((v == -1 && PyErr_Occurred()) || u32_arg(v, "w_addr", &wa[i])) goto done;
    }
    npy_intp n = (npy_intp)(c.cmd_bytes / 8);
    if (!(a = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_UINT64))) goto done;
    ork_err err;
    err.msg[0] = 0;
    ork_status st;
    uint64_t *q = (uint64_t *)PyArray_DATA(a);
    Py_BEGIN_ALLOW_THREADS
    st = ork_npu_chain_emit(&c, c_a, i_a, wa, o_a, q, &err);
    Py_END_ALLOW_THREADS
    if (st) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = (PyObject *)a;
    a = NULL;
done:
    Py_XDECREF(a);
    Py_XDECREF(wseq);
    PyMem_Free(wa);
    ork_npu_chain_free(&c);
    return result;
}

/* npu_layout(op, M, K, N, array, max_m, max_k, max_n): op "pack_input" (A int8 (M,K) -> uint8 buffer),
 * "unpack_input", "pack_weights" (B int8 (N,K)), "unpack_weights", "unpack_output" (uint8 -> int32 (M,N)) */
PyObject *orkpy_npu_layout(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"op", "M", "K", "N", "array", "max_m", "max_k", "max_n", NULL};
    const char *op;
    long long M, K, N, mm = 0, mk = 0, mn = 0;
    PyObject *obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sLLLO|LLL:npu_layout", kwlist, &op, &M, &K, &N, &obj, &mm, &mk, &mn))
        return NULL;
    ork_npu_plan p;
    if (make_plan(M, K, N, mm, mk, mn, &p)) return NULL;
    PyArrayObject *in = NULL, *out = NULL;
    PyObject *result = NULL;
    ork_err err;
    err.msg[0] = 0;
    ork_status st = ORK_OK;
    int pack_in = !strcmp(op, "pack_input"), pack_w = !strcmp(op, "pack_weights");
    if (pack_in || pack_w) {
        in = orkpy_as_exact(obj, NPY_INT8, 2, pack_in ? "A" : "B");
        if (!in) goto done;
        npy_intp rows = pack_in ? (npy_intp)p.M : (npy_intp)p.N;
        if (PyArray_DIM(in, 0) != rows || PyArray_DIM(in, 1) != (npy_intp)p.K) {
            PyErr_Format(PyExc_ValueError, "%s must have shape (%zd, %u)", pack_in ? "A" : "B", (Py_ssize_t)rows, p.K);
            goto done;
        }
        npy_intp n = (npy_intp)(pack_in ? p.in_bytes : p.w_bytes);
        out = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_UINT8);
        if (!out) goto done;
        const int8_t *src = (const int8_t *)PyArray_DATA(in);
        uint8_t *dst = (uint8_t *)PyArray_DATA(out);
        Py_BEGIN_ALLOW_THREADS
        st = pack_in ? ork_npu_pack_input(&p, src, p.K, dst, &err) : ork_npu_pack_weights(&p, src, p.K, dst, &err);
        Py_END_ALLOW_THREADS
    } else if (!strcmp(op, "unpack_input") || !strcmp(op, "unpack_weights") || !strcmp(op, "unpack_output")) {
        int ui = op[7] == 'i', uw = op[7] == 'w';
        in = orkpy_as_exact(obj, NPY_UINT8, 1, "buffer");
        if (!in) goto done;
        uint64_t need = ui ? p.in_bytes : uw ? p.w_bytes : p.out_bytes;
        if ((uint64_t)PyArray_DIM(in, 0) != need) {
            PyErr_Format(PyExc_ValueError, "buffer must have %llu bytes for this plan, got %zd", (unsigned long long)need,
                         (Py_ssize_t)PyArray_DIM(in, 0));
            goto done;
        }
        npy_intp dims[2] = {uw ? (npy_intp)p.N : (npy_intp)p.M, (ui || uw) ? (npy_intp)p.K : (npy_intp)p.N};
        out = (PyArrayObject *)PyArray_ZEROS(2, dims, (ui || uw) ? NPY_INT8 : NPY_INT32, 0);
        if (!out) goto done;
        const uint8_t *b = (const uint8_t *)PyArray_DATA(in);
        void *dst = PyArray_DATA(out);
        Py_BEGIN_ALLOW_THREADS
        st = ui ? ork_npu_unpack_input(&p, b, (int8_t *)dst, &err)
           : uw ? ork_npu_unpack_weights(&p, b, (int8_t *)dst, &err)
                : ork_npu_unpack_output(&p, b, (int32_t *)dst, &err);
        Py_END_ALLOW_THREADS
    } else {
        PyErr_Format(PyExc_ValueError, "unknown layout op '%s'", op);
        goto done;
    }
    if (st) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = (PyObject *)out;
    out = NULL;
done:
    Py_XDECREF(in);
    Py_XDECREF(out);
    ork_npu_plan_free(&p);
    return result;
}

/* npu_emulate(buffers=[(addr, uint8 array (writable)), ...], first_addr, amount, task_number) -> dict */
typedef struct {
    size_t n;
    uint32_t addr[64];
    uint64_t size[64];
    uint8_t *ptr[64];
} emu_bufs;

static void *emu_bufs_map(void *ctx, uint32_t addr, uint64_t len) {
    emu_bufs *b = (emu_bufs *)ctx;
    for (size_t i = 0; i < b->n; i++)
        if (addr >= b->addr[i] && (uint64_t)addr - b->addr[i] + len <= b->size[i]) return b->ptr[i] + (addr - b->addr[i]);
    return NULL;
}

PyObject *orkpy_npu_emulate(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"buffers", "first_addr", "amount", "task_number", NULL};
    PyObject *bufs;
    long long fa, am, tn;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OLLL:npu_emulate", kwlist, &bufs, &fa, &am, &tn)) return NULL;
    uint32_t first, amount, tasks;
    if (u32_arg(fa, "first_addr", &first) || u32_arg(am, "amount", &amount) || u32_arg(tn, "task_number", &tasks))
        return NULL;
    emu_bufs eb;
    eb.n = 0;
    PyArrayObject *arrs[64];
    PyObject *result = NULL;
    PyObject *seq = PySequence_Fast(bufs, "buffers must be a sequence of (address, uint8 array)");
    if (!seq) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > 64) {
        PyErr_Format(PyExc_ValueError, "at most 64 buffers");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        long long addr;
        PyObject *arr;
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2) {
            PyErr_SetString(PyExc_TypeError, "each buffer must be a tuple (npu_address, uint8 array)");
            goto done;
        }
        if (!PyArg_ParseTuple(it, "LO", &addr, &arr) || u32_arg(addr, "buffer address", &eb.addr[i])) goto done;
        if (!PyArray_Check(arr) || PyArray_TYPE((PyArrayObject *)arr) != NPY_UINT8 ||
            !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)arr) || !PyArray_ISWRITEABLE((PyArrayObject *)arr)) {
            PyErr_SetString(PyExc_TypeError, "each buffer must be a writable C-contiguous uint8 array");
            goto done;
        }
        eb.size[i] = (uint64_t)PyArray_NBYTES((PyArrayObject *)arr);
        if ((uint64_t)eb.addr[i] + eb.size[i] > ((uint64_t)1 << 32)) {
            PyErr_Format(PyExc_ValueError, "buffer at 0x%08x of %llu bytes crosses the 32-bit NPU address space",
                         eb.addr[i], (unsigned long long)eb.size[i]);
            goto done;
        }
        Py_INCREF(arr); /* held while the GIL is released */
        arrs[i] = (PyArrayObject *)arr;
        eb.ptr[i] = (uint8_t *)PyArray_DATA(arrs[i]);
        eb.n++;
    }
    ork_npu_mem mem = {&eb, emu_bufs_map};
    ork_npu_emu_stats stats;
    memset(&stats, 0, sizeof stats);
    ork_err err;
    err.msg[0] = 0;
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_npu_emu_run(&mem, first, amount, tasks, NULL, &stats, &err);
    Py_END_ALLOW_THREADS
    if (st) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = Py_BuildValue("{s:K,s:K,s:K}", "tasks", (unsigned long long)stats.tasks, "qwords",
                           (unsigned long long)stats.qwords, "macs", (unsigned long long)stats.macs);
done:
    for (size_t i = 0; i < eb.n; i++) Py_DECREF(arrs[i]);
    Py_XDECREF(seq);
    return result;
}

/* the backend named s (backend.h), or -1 with a ValueError listing the backends */
static int backend_arg(const char *s, ork_npu_backend_kind *k) {
    if (ork_npu_backend_find(s, k) == 0) return 0;
    PyObject *names = orkpy_npu_backends(NULL, NULL), *sep = names ? PyUnicode_FromString(", ") : NULL;
    PyObject *joined = sep ? PyUnicode_Join(sep, names) : NULL;
    if (joined) PyErr_Format(PyExc_ValueError, "unknown NPU backend '%s' (expected one of %U)", s, joined);
    Py_XDECREF(names);
    Py_XDECREF(sep);
    Py_XDECREF(joined);
    return -1;
}

PyObject *orkpy_npu_backends(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *t = PyTuple_New(ORK_NPU_BE_COUNT);
    for (int i = 0; t && i < ORK_NPU_BE_COUNT; i++) {
        PyObject *s = PyUnicode_FromString(ork_npu_backend_names[i]);
        if (!s) Py_CLEAR(t);
        else PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

PyObject *orkpy_npu_pc_amount(PyObject *self, PyObject *arg) {
    (void)self;
    long long body = PyLong_AsLongLong(arg);
    if (body == -1 && PyErr_Occurred()) return NULL;
    uint32_t b;
    if (u32_arg(body, "body_qwords", &b) < 0) return NULL;
    return PyLong_FromUnsignedLong(ork_npu_pc_amount(b));
}

PyObject *orkpy_npu_probe(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    ork_npu_backend_kind k;
    if (!name || backend_arg(name, &k) < 0) return NULL;
    char why[256] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ork_npu_probe(k, why, sizeof why);
    Py_END_ALLOW_THREADS
    if (rc == 0) Py_RETURN_NONE;
    return PyUnicode_FromString(why);
}

/* ---------------------------------------------------------- NPUDevice --- *
 * The objects wrap the core's device, weights and jobs (csrc/ork/npu/device.h), which own the
 * lock, the buffers, the job cache and the fake kernel; each object keeps what it borrows alive
 * (a weight its device, a job its device and weights) and every core call runs without the GIL. */
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
    if (u32_arg(base, "emu_base", &ebase) || u32_arg(tmo, "timeout_ms", &t) || backend_arg(be, &k) < 0) return -1;
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

/* 0 when the device is open, else -1 with "the NPU device is closed" */
static int dev_check(DevObject *self) {
    if (self->d && ork_npu_device_is_open(self->d)) return 0;
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

/* upload(B int8 (N, K), max_m=0, max_k=0, max_n=0) -> NPUWeight */
static PyObject *dev_upload(DevObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"B", "max_m", "max_k", "max_n", NULL};
    PyObject *obj;
    long long mm = 0, mk = 0, mn = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|LLL:upload", kwlist, &obj, &mm, &mk, &mn) || dev_check(self)) return NULL;
    ork_npu_plan_opts o;
    if (caps_arg(mm, mk, mn, &o)) return NULL;
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

/* upload_packed(kind, store uint8 1-D, lut int8 (16,), N, K, max_m=0, max_k=0, max_n=0) -> NPUWeight */
static PyObject *dev_upload_packed(DevObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"kind", "store", "lut", "N", "K", "max_m", "max_k", "max_n", NULL};
    const char *ks;
    PyObject *so, *lo;
    long long N, K, mm = 0, mk = 0, mn = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sOOLL|LLL:upload_packed", kwlist, &ks, &so, &lo, &N, &K, &mm, &mk, &mn) ||
        dev_check(self))
        return NULL;
    const ork_kind_info *ki = orkpy_parse_kind(ks);
    ork_npu_plan_opts o;
    uint32_t n, k;
    if (!ki || u32_arg(N, "N", &n) || u32_arg(K, "K", &k) || caps_arg(mm, mk, mn, &o)) return NULL;
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

/* matmul(weight, A int8 (M, K)) -> int32 (M, N) */
static PyObject *dev_matmul(DevObject *self, PyObject *args) {
    PyObject *wo, *ao;
    if (!PyArg_ParseTuple(args, "O!O:matmul", &WeightType, &wo, &ao) || dev_check(self)) return NULL;
    WeightObject *w = (WeightObject *)wo;
    if (!ork_npu_dweight_on(w->w, self->d)) return PyErr_Format(PyExc_ValueError, "the weight belongs to another NPU device");
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
    npy_intp dims[2] = {M, (npy_intp)N};
    if (!(c = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_INT32))) goto done;
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
    if (!self->d) return PyErr_Format(PyExc_ValueError, "the NPU device is closed");
    ork_status st = ork_npu_device_info(self->d, &i, &err);
    if (st) return orkpy_raise(st, &err);
    PyObject *r = NULL, *f = NULL, *result = NULL;
    ork_npu_fake_report *rep = NULL;
    r = Py_BuildValue("{s:s,s:s,s:s,s:K,s:K,s:K,s:K,s:K,s:I}", "backend", i.backend, "node", i.node, "sys", i.sys,
                      "submits", (unsigned long long)i.submits, "plans", (unsigned long long)i.plans, "tasks",
                      (unsigned long long)i.tasks, "bytes_to_device",
                      (unsigned long long)i.bytes_to_device, "bytes_from_device", (unsigned long long)i.bytes_from_device,
                      "timeout_ms", ork_npu_device_timeout_ms(self->d));
    if (!r) goto done;
    if (!(rep = (ork_npu_fake_report *)PyMem_Malloc(sizeof *rep))) {
        PyErr_NoMemory();
        goto done;
    }
    if (ork_npu_device_fake_report(self->d, rep)) {
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
    PyMem_Free(rep);
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
     "upload(B int8 (N, K), max_m=0, max_k=0, max_n=0) -> NPUWeight resident on the device"},
    {"upload_packed", (PyCFunction)(void (*)(void))dev_upload_packed, METH_VARARGS | METH_KEYWORDS,
     "upload_packed(kind, store, lut, N, K, ...) -> NPUWeight from a PackedWeight tile store"},
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
    if (!ork_npu_djob_live(self->j)) return PyErr_Format(PyExc_ValueError, "the NPU device of the job is closed");
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

int orkpy_npu_weight_hook(PyObject *obj, ork_int_mm_fn *fn, void **ctx, size_t *N, size_t *K) {
    if (!PyObject_TypeCheck(obj, &WeightType)) {
        PyErr_SetString(PyExc_TypeError, "expected an orkpy._core.NPUWeight");
        return -1;
    }
    WeightObject *w = (WeightObject *)obj;
    if (!ork_npu_dweight_on(w->w, w->owner->d)) {
        PyErr_SetString(PyExc_ValueError, "the NPU weight's device is closed");
        return -1;
    }
    uint32_t n, k;
    ork_npu_dweight_shape(w->w, &n, &k);
    *fn = ork_npu_dweight_int_mm;
    *ctx = w->w;
    *N = n;
    *K = k;
    return 0;
}

/* _npu_install_fake_kernel_for_tests(address): test machinery only. address: the
 * ork_npu_test_kernel table the tests' fake kernel library returns (an integer from
 * ctypes; 0 uninstalls), handed to the core (device.h, "test kernels") */
PyObject *orkpy_npu_install_fake_kernel_for_tests(PyObject *self, PyObject *arg) {
    (void)self;
    void *p = PyLong_AsVoidPtr(arg);
    if (!p && PyErr_Occurred()) return NULL;
    ork_err err;
    err.msg[0] = 0;
    ork_status st = ork_npu_test_kernel_install((const ork_npu_test_kernel *)p, &err);
    if (st) return orkpy_raise(st, &err);
    Py_RETURN_NONE;
}

int orkpy_npu_init(PyObject *module) {
    if (PyType_Ready(&DevType) < 0 || PyType_Ready(&WeightType) < 0 || PyType_Ready(&JobType) < 0) return -1;
    Py_INCREF(&DevType);
    if (PyModule_AddObject(module, "NPUDevice", (PyObject *)&DevType) < 0) {
        Py_DECREF(&DevType);
        return -1;
    }
    Py_INCREF(&WeightType);
    if (PyModule_AddObject(module, "NPUWeight", (PyObject *)&WeightType) < 0) {
        Py_DECREF(&WeightType);
        return -1;
    }
    Py_INCREF(&JobType);
    if (PyModule_AddObject(module, "NPUJob", (PyObject *)&JobType) < 0) {
        Py_DECREF(&JobType);
        return -1;
    }
    return 0;
}
