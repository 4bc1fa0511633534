/* py_npu.c - binding of the NPU layer (csrc/ork/npu): register commands
 * (regcmd.h), the planner and operand layouts (plan.h), the emulator (emu.h)
 * and the test-only hook of the fake kernel library (device.h, "test kernels");
 * the NPUDevice / NPUWeight / NPUJob objects are in py_npu_device.c. Same shape as every
 * binding (module.c): parse, coerce, release the GIL, call the core, map the
 * status; every function that holds references ends at one cleanup label. */
#include "numpy_api.h"

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
    else if (strcmp(dt, "int4") == 0) d.dtype = ORK_NPU_INT4_INT16;
    else
        return PyErr_Format(PyExc_ValueError, "dtype must be 'int8' (-> int32), 'fp16' (-> fp32) or 'int4' (-> int16), got "
                            "'%s'", dt);
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

/* npu_int4_facts() -> [dict(register, field, value (None: see formula), formula, basis)] (regcmd.h) */
PyObject *orkpy_npu_int4_facts(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    size_t n;
    const ork_npu_reg_fact *f = ork_npu_int4_facts(&n);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *v = f[i].value < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(f[i].value);
        PyObject *row = v ? Py_BuildValue("{s:s,s:s,s:N,s:s,s:s}", "register", f[i].reg, "field", f[i].field, "value", v,
                                          "formula", f[i].formula, "basis", f[i].basis)
                          : NULL;
        if (!row) Py_CLEAR(out);
        else PyList_SET_ITEM(out, (Py_ssize_t)i, row);
    }
    return out;
}

PyObject *orkpy_npu_names(PyObject *self, PyObject *args) {
    (void)self;
    unsigned int target, reg;
    if (!PyArg_ParseTuple(args, "II:npu_names", &target, &reg)) return NULL;
    const char *t = ork_npu_target_name(target), *r = ork_npu_reg_name(target, reg);
    return Py_BuildValue("(zz)", t, r);
}

/* ------------------------------------------------------------------------
 * Planner, layouts and the emulator as functions (the device objects:
 * py_npu_device.c).
 * ------------------------------------------------------------------------ */
#include "../ork/npu/backend.h"
#include "../ork/npu/device.h"
#include "../ork/npu/emu.h"
#include "../ork/npu/plan.h"

int orkpy_u32_arg(long long v, const char *name, uint32_t *out) {
    if (v < 0 || v > 0xffffffffLL) {
        PyErr_Format(PyExc_ValueError, "%s must be in [0, 2^32), got %lld", name, v);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* the per-task tile caps max_m, max_k, max_n (0 = hardware limit); the precision int8 */
int orkpy_npu_caps_arg(long long mm, long long mk, long long mn, ork_npu_plan_opts *o) {
    memset(o, 0, sizeof *o);
    return orkpy_u32_arg(mm, "max_m", &o->max_m) || orkpy_u32_arg(mk, "max_k", &o->max_k) || orkpy_u32_arg(mn, "max_n", &o->max_n) ? -1
                                                                                                              : 0;
}

/* precision "int8" (None too) or "int4" -> o->precision */
int orkpy_npu_prec_arg(const char *s, ork_npu_plan_opts *o) {
    if (!s || !strcmp(s, "int8")) o->precision = ORK_NPU_PREC_INT8;
    else if (!strcmp(s, "int4")) o->precision = ORK_NPU_PREC_INT4;
    else {
        PyErr_Format(PyExc_ValueError, "precision must be 'int8' (int8 x int8 -> int32) or 'int4' (int4 x int4 -> int16 "
                     "tiles), got '%s'", s);
        return -1;
    }
    return 0;
}

static int make_plan(long long M, long long K, long long N, long long mm, long long mk, long long mn, const char *prec,
                     ork_npu_plan *p) {
    uint32_t m, k, n;
    ork_npu_plan_opts o;
    if (orkpy_u32_arg(M, "M", &m) || orkpy_u32_arg(K, "K", &k) || orkpy_u32_arg(N, "N", &n) ||
        orkpy_npu_caps_arg(mm, mk, mn, &o) || orkpy_npu_prec_arg(prec, &o))
        return -1;
    ork_err err;
    err.msg[0] = 0;
    ork_status st = ork_npu_plan_make(m, k, n, &o, p, &err);
    if (st) {
        orkpy_raise(st, &err);
        return -1;
    }
    return 0;
}

#define PLAN_KW "M", "K", "N", "max_m", "max_k", "max_n", "precision"

PyObject *orkpy_npu_plan(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {PLAN_KW, NULL};
    long long M, K, N, mm = 0, mk = 0, mn = 0;
    const char *prec = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LLL|LLLz:npu_plan", kwlist, &M, &K, &N, &mm, &mk, &mn, &prec)) return NULL;
    ork_npu_plan p;
    if (make_plan(M, K, N, mm, mk, mn, prec, &p)) return NULL;
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
    result = Py_BuildValue("{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:K,s:K,s:K,s:K,s:K,s:O}", "precision",
                           p.prec == ORK_NPU_PREC_INT4 ? "int4" : "int8", "out_esz", p.out_esz, "M", p.M, "K", p.K, "N", p.N,
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
    static char *kwlist[] = {"M", "K", "N", "cmd_addr", "in_addr", "w_addr", "out_addr", "max_m", "max_k", "max_n",
                             "precision", NULL};
    long long M, K, N, ca, ia, wa, oa, mm = 0, mk = 0, mn = 0;
    const char *prec = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LLLLLLL|LLLz:npu_plan_emit", kwlist, &M, &K, &N, &ca, &ia, &wa, &oa, &mm,
                                     &mk, &mn, &prec))
        return NULL;
    uint32_t c, i, w, o;
    if (orkpy_u32_arg(ca, "cmd_addr", &c) || orkpy_u32_arg(ia, "in_addr", &i) || orkpy_u32_arg(wa, "w_addr", &w) ||
        orkpy_u32_arg(oa, "out_addr", &o))
        return NULL;
    ork_npu_plan p;
    if (make_plan(M, K, N, mm, mk, mn, prec, &p)) return NULL;
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

/* shapes: a sequence of (M, K, N) or (M, K, N, precision) -> a chain with the same caps for every matmul
 * (a shape without its own precision takes prec) */
static int make_chain(PyObject *shapes, long long mm, long long mk, long long mn, const char *prec, ork_npu_chain *c) {
    ork_npu_plan_opts o;
    if (orkpy_npu_caps_arg(mm, mk, mn, &o) || orkpy_npu_prec_arg(prec, &o)) return -1;
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
        const char *pi = prec;
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(it)) {
            PyErr_SetString(PyExc_TypeError, "each shape must be a tuple (M, K, N) or (M, K, N, precision)");
            goto done;
        }
        op[i] = o;
        if (!PyArg_ParseTuple(it, "LLL|z;each shape must be (M, K, N) or (M, K, N, precision)", &M, &K, &N, &pi) ||
            orkpy_u32_arg(M, "M", &d[i]) || orkpy_u32_arg(K, "K", &d[n + i]) || orkpy_u32_arg(N, "N", &d[2 * n + i]) ||
            orkpy_npu_prec_arg(pi, &op[i]))
            goto done;
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
    static char *kwlist[] = {"shapes", "max_m", "max_k", "max_n", "precision", NULL};
    PyObject *shapes, *parts = NULL, *result = NULL;
    long long mm = 0, mk = 0, mn = 0;
    const char *prec = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|LLLz:npu_chain_plan", kwlist, &shapes, &mm, &mk, &mn, &prec)) return NULL;
    ork_npu_chain c;
    if (make_chain(shapes, mm, mk, mn, prec, &c)) return NULL;
    if (!(parts = PyList_New(c.n))) goto done;
    for (uint32_t i = 0; i < c.n; i++) {
        const ork_npu_plan *p = &c.plans[i];
        PyObject *row = Py_BuildValue("{s:s,s:I,s:I,s:I,s:I,s:K,s:K,s:K,s:K,s:K,s:K}", "precision",
                                      p->prec == ORK_NPU_PREC_INT4 ? "int4" : "int8", "M", p->M, "K", p->K, "N", p->N,
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
    static char *kwlist[] = {"shapes", "cmd_addr", "in_addr", "w_addrs", "out_addr", "max_m", "max_k", "max_n",
                             "precision", NULL};
    PyObject *shapes, *wobj, *wseq = NULL;
    long long ca, ia, oa, mm = 0, mk = 0, mn = 0;
    const char *prec = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OLLOL|LLLz:npu_chain_emit", kwlist, &shapes, &ca, &ia, &wobj, &oa, &mm, &mk,
                                     &mn, &prec))
        return NULL;
    uint32_t c_a, i_a, o_a;
    if (orkpy_u32_arg(ca, "cmd_addr", &c_a) || orkpy_u32_arg(ia, "in_addr", &i_a) || orkpy_u32_arg(oa, "out_addr", &o_a)) return NULL;
    ork_npu_chain c;
    if (make_chain(shapes, mm, mk, mn, prec, &c)) return NULL;
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
        if ((v == -1 && PyErr_Occurred()) || orkpy_u32_arg(v, "w_addr", &wa[i])) goto done;
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
    static char *kwlist[] = {"op", "M", "K", "N", "array", "max_m", "max_k", "max_n", "precision", NULL};
    const char *op, *prec = NULL;
    long long M, K, N, mm = 0, mk = 0, mn = 0;
    PyObject *obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sLLLO|LLLz:npu_layout", kwlist, &op, &M, &K, &N, &obj, &mm, &mk, &mn, &prec))
        return NULL;
    ork_npu_plan p;
    if (make_plan(M, K, N, mm, mk, mn, prec, &p)) return NULL;
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
    if (orkpy_u32_arg(fa, "first_addr", &first) || orkpy_u32_arg(am, "amount", &amount) || orkpy_u32_arg(tn, "task_number", &tasks))
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
        if (!PyArg_ParseTuple(it, "LO", &addr, &arr) || orkpy_u32_arg(addr, "buffer address", &eb.addr[i])) goto done;
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
int orkpy_npu_backend_arg(const char *s, ork_npu_backend_kind *k) {
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
    if (orkpy_u32_arg(body, "body_qwords", &b) < 0) return NULL;
    return PyLong_FromUnsignedLong(ork_npu_pc_amount(b));
}

PyObject *orkpy_npu_probe(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    ork_npu_backend_kind k;
    if (!name || orkpy_npu_backend_arg(name, &k) < 0) return NULL;
    char why[256] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ork_npu_probe(k, why, sizeof why);
    Py_END_ALLOW_THREADS
    if (rc == 0) Py_RETURN_NONE;
    return PyUnicode_FromString(why);
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
