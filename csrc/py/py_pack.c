/* py_pack.c - binding of packed weights (pack.h), the matmul drivers and the
 * O4N1/O8N1 header codec (o4n1.h). Same shape as every binding: parse,
 * coerce, release the GIL, call the core, map the status. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL orkpy_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <string.h>

#include "../ork/o4n1.h"
#include "../ork/pack.h"
#include "bindings.h"
#include "errors.h"

static int check_nk(Py_ssize_t N, Py_ssize_t K) {
    if (N <= 0 || K <= 0) {
        PyErr_Format(PyExc_ValueError, "N and K must be positive, got N = %zd, K = %zd", N, K);
        return -1;
    }
    return 0;
}

/* the store array of a packed weight: (NB, KB, 32, 16) uint8 or (NB, KB, 32, 32) int8 */
static PyArrayObject *as_store(PyObject *obj, ork_kind kind, Py_ssize_t N, Py_ssize_t K) {
    int four = kind != ORK_KIND_INT8;
    PyArrayObject *a = orkpy_as_exact(obj, four ? NPY_UINT8 : NPY_INT8, 4, "store");
    if (!a) return NULL;
    npy_intp want[4] = {(npy_intp)(ork_pack_round32((size_t)N) / 32), (npy_intp)(ork_pack_round32((size_t)K) / 32),
                        32, four ? 16 : 32};
    for (int d = 0; d < 4; d++)
        if (PyArray_DIM(a, d) != want[d]) {
            PyErr_Format(PyExc_ValueError, "store has shape (%zd, %zd, %zd, %zd), expected (%zd, %zd, 32, %zd) for N = %zd, K = %zd",
                         (Py_ssize_t)PyArray_DIM(a, 0), (Py_ssize_t)PyArray_DIM(a, 1), (Py_ssize_t)PyArray_DIM(a, 2),
                         (Py_ssize_t)PyArray_DIM(a, 3), (Py_ssize_t)want[0], (Py_ssize_t)want[1], (Py_ssize_t)want[3], N, K);
            Py_DECREF(a);
            return NULL;
        }
    return a;
}

PyObject *orkpy_pack(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"codes", "kind", "N", "K", NULL};
    PyObject *c_obj;
    const char *kind_s;
    Py_ssize_t N, K;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Osnn:pack", kwlist, &c_obj, &kind_s, &N, &K)) return NULL;
    ork_kind kind;
    if (orkpy_parse_kind(kind_s, &kind) < 0 || check_nk(N, K) < 0) return NULL;
    int four = kind != ORK_KIND_INT8;
    PyArrayObject *codes = orkpy_as_exact(c_obj, four ? NPY_UINT8 : NPY_INT8, 2, "codes");
    if (!codes) return NULL;
    if (PyArray_DIM(codes, 0) != N || PyArray_DIM(codes, 1) != (npy_intp)ork_quant_row_bytes(kind, (size_t)K)) {
        Py_DECREF(codes);
        return PyErr_Format(PyExc_ValueError, "codes do not fit kind '%s' with N = %zd, K = %zd", kind_s, N, K);
    }
    npy_intp dims[4] = {(npy_intp)(ork_pack_round32((size_t)N) / 32), (npy_intp)(ork_pack_round32((size_t)K) / 32),
                        32, four ? 16 : 32};
    PyArrayObject *store = (PyArrayObject *)PyArray_SimpleNew(4, dims, four ? NPY_UINT8 : NPY_INT8);
    if (!store) {
        Py_DECREF(codes);
        return NULL;
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_pack(kind, PyArray_DATA(codes), (size_t)N, (size_t)K, PyArray_DATA(store), &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(codes);
    if (st != ORK_OK) {
        Py_DECREF(store);
        return orkpy_raise(st, &err);
    }
    return (PyObject *)store;
}

PyObject *orkpy_unpack(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"store", "kind", "N", "K", NULL};
    PyObject *s_obj;
    const char *kind_s;
    Py_ssize_t N, K;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Osnn:unpack", kwlist, &s_obj, &kind_s, &N, &K)) return NULL;
    ork_kind kind;
    if (orkpy_parse_kind(kind_s, &kind) < 0 || check_nk(N, K) < 0) return NULL;
    PyArrayObject *store = as_store(s_obj, kind, N, K);
    if (!store) return NULL;
    npy_intp dims[2] = {N, (npy_intp)ork_quant_row_bytes(kind, (size_t)K)};
    PyArrayObject *codes = (PyArrayObject *)PyArray_SimpleNew(2, dims, kind == ORK_KIND_INT8 ? NPY_INT8 : NPY_UINT8);
    if (!codes) {
        Py_DECREF(store);
        return NULL;
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_unpack(kind, PyArray_DATA(store), (size_t)N, (size_t)K, PyArray_DATA(codes), &err);
    Py_DECREF(store);
    if (st != ORK_OK) {
        Py_DECREF(codes);
        return orkpy_raise(st, &err);
    }
    return (PyObject *)codes;
}

PyObject *orkpy_matmul_int(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"store", "kind", "N", "K", "xq", "threads", NULL};
    PyObject *s_obj, *x_obj;
    const char *kind_s;
    Py_ssize_t N, K;
    int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsnnO|i:matmul_int", kwlist, &s_obj, &kind_s, &N, &K, &x_obj,
                                     &threads))
        return NULL;
    ork_kind kind;
    if (orkpy_parse_kind(kind_s, &kind) < 0 || check_nk(N, K) < 0 || orkpy_check_threads(threads) < 0) return NULL;
    PyArrayObject *store = NULL, *x = NULL, *out = NULL;
    PyObject *result = NULL;
    if (!(store = as_store(s_obj, kind, N, K))) goto done;
    if (!(x = orkpy_as_exact(x_obj, NPY_INT8, 2, "xq"))) goto done;
    if (PyArray_DIM(x, 1) != K || PyArray_DIM(x, 0) < 1) {
        PyErr_Format(PyExc_ValueError, "xq must have shape (M >= 1, K = %zd), got (%zd, %zd)", K,
                     (Py_ssize_t)PyArray_DIM(x, 0), (Py_ssize_t)PyArray_DIM(x, 1));
        goto done;
    }
    npy_intp M = PyArray_DIM(x, 0);
    npy_intp dims[2] = {M, N};
    if (!(out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_INT32))) goto done;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_matmul_int(kind, PyArray_DATA(store), ork_quant_lut(kind), (size_t)N, (size_t)K,
                        (const int8_t *)PyArray_DATA(x), (size_t)M, (int32_t *)PyArray_DATA(out), threads, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = (PyObject *)out;
    out = NULL;
done:
    Py_XDECREF(store);
    Py_XDECREF(x);
    Py_XDECREF(out);
    return result;
}

PyObject *orkpy_matmul(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"store", "kind", "N", "K", "bscale", "x", "per_tensor", "threads", NULL};
    PyObject *s_obj, *b_obj, *x_obj;
    const char *kind_s;
    Py_ssize_t N, K;
    int per_tensor = 0, threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsnnOO|pi:matmul", kwlist, &s_obj, &kind_s, &N, &K, &b_obj, &x_obj,
                                     &per_tensor, &threads))
        return NULL;
    ork_kind kind;
    if (orkpy_parse_kind(kind_s, &kind) < 0 || check_nk(N, K) < 0 || orkpy_check_threads(threads) < 0) return NULL;
    PyArrayObject *store = NULL, *bs = NULL, *x = NULL, *out = NULL;
    PyObject *result = NULL;
    if (!(store = as_store(s_obj, kind, N, K))) goto done;
    if (!(bs = orkpy_as_exact(b_obj, NPY_FLOAT32, 1, "bscale"))) goto done;
    if (PyArray_DIM(bs, 0) != N) {
        PyErr_Format(PyExc_ValueError, "bscale has %zd entries, expected N = %zd", (Py_ssize_t)PyArray_DIM(bs, 0), N);
        goto done;
    }
    if (!(x = orkpy_as_float32(x_obj, 2, "x"))) goto done;
    if (PyArray_DIM(x, 1) != K || PyArray_DIM(x, 0) < 1) {
        PyErr_Format(PyExc_ValueError, "x must have shape (M >= 1, K = %zd), got (%zd, %zd)", K,
                     (Py_ssize_t)PyArray_DIM(x, 0), (Py_ssize_t)PyArray_DIM(x, 1));
        goto done;
    }
    npy_intp M = PyArray_DIM(x, 0);
    npy_intp dims[2] = {M, N};
    if (!(out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT32))) goto done;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_matmul_f32(kind, PyArray_DATA(store), ork_quant_lut(kind), (const float *)PyArray_DATA(bs), (size_t)N,
                        (size_t)K, (const float *)PyArray_DATA(x), (size_t)M, per_tensor,
                        (float *)PyArray_DATA(out), threads, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = (PyObject *)out;
    out = NULL;
done:
    Py_XDECREF(store);
    Py_XDECREF(bs);
    Py_XDECREF(x);
    Py_XDECREF(out);
    return result;
}

PyObject *orkpy_packed_header(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"kind", "N", "K", NULL};
    const char *kind_s;
    Py_ssize_t N, K;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "snn:packed_header", kwlist, &kind_s, &N, &K)) return NULL;
    ork_kind kind;
    if (orkpy_parse_kind(kind_s, &kind) < 0 || check_nk(N, K) < 0) return NULL;
    uint8_t hdr[ORK_O4N1_HEADER];
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_o4n1_header(kind, (uint64_t)N, (uint64_t)K, hdr, &err);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    return PyBytes_FromStringAndSize((const char *)hdr, ORK_O4N1_HEADER);
}

PyObject *orkpy_packed_parse(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    ork_o4n1_info info;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_o4n1_parse((const uint8_t *)view.buf, (size_t)view.len, &info, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    static const char *names[3] = {"nf4", "int4", "int8"};
    return Py_BuildValue("{s:s,s:K,s:K,s:K,s:K,s:K}", "kind", names[info.kind], "N", (unsigned long long)info.N, "K",
                         (unsigned long long)info.K, "scales_offset", (unsigned long long)info.scales_off,
                         "store_offset", (unsigned long long)info.store_off, "store_bytes",
                         (unsigned long long)info.store_bytes);
}

/* packed_check(store, kind, N, K, bscale): the door of PackedWeight(...): the
 * store's dtype and shape, its codes (no int8 -128) and the scales (finite,
 * >= +0, <= ork_pack_max_scale(K)); ValueError / TypeError naming the entry. */
PyObject *orkpy_packed_check(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"store", "kind", "N", "K", "bscale", NULL};
    PyObject *s_obj, *b_obj;
    const char *kind_s;
    Py_ssize_t N, K;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsnnO:packed_check", kwlist, &s_obj, &kind_s, &N, &K, &b_obj))
        return NULL;
    ork_kind kind;
    if (orkpy_parse_kind(kind_s, &kind) < 0 || check_nk(N, K) < 0) return NULL;
    PyArrayObject *store = NULL, *bs = NULL;
    PyObject *result = NULL;
    if (!(store = as_store(s_obj, kind, N, K))) goto done;
    if (!(bs = orkpy_as_exact(b_obj, NPY_FLOAT32, 1, "bscale"))) goto done;
    if (PyArray_DIM(bs, 0) != N) {
        PyErr_Format(PyExc_ValueError, "bscale has %zd entries, expected N = %zd", (Py_ssize_t)PyArray_DIM(bs, 0), N);
        goto done;
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_pack_check_store(kind, PyArray_DATA(store), (size_t)N, (size_t)K, &err);
    if (st == ORK_OK)
        st = ork_pack_check_scales((const float *)PyArray_DATA(bs), (size_t)N, (size_t)K, ORK_EINVAL, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(store);
    Py_XDECREF(bs);
    return result;
}
