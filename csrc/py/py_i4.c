/* py_i4.c - binding of the int4 x int4 -> int16 matmul contract (csrc/ork/i4.h): its layout
 * facts, the storage codec, the driver and the _ref's int16 partials. Same shape as every
 * binding: parse, coerce, release the GIL, call the core, map the status. */
#include "numpy_api.h"

#include "../ork/i4.h"
#include "bindings.h"
#include "errors.h"

static int check_k(Py_ssize_t K) {
    if (K < 1 || (size_t)K > ORK_I4_MAX_K) {
        PyErr_Format(PyExc_ValueError, "K must be in [1, %zu], got %zd", ORK_I4_MAX_K, K);
        return -1;
    }
    return 0;
}

/* a stored operand: uint8 (rows >= 1, Kp / 2) */
static PyArrayObject *as_stored(PyObject *obj, Py_ssize_t K, const char *name) {
    PyArrayObject *p = orkpy_as_exact(obj, NPY_UINT8, 2, name);
    if (!p) return NULL;
    if (PyArray_DIM(p, 0) < 1 || (size_t)PyArray_DIM(p, 1) != ork_i4_row_bytes((size_t)K)) {
        PyErr_Format(PyExc_ValueError, "%s must have shape (rows >= 1, %zu) for K = %zd (Kp / 2 bytes a row), got (%zd, %zd)",
                     name, ork_i4_row_bytes((size_t)K), K, (Py_ssize_t)PyArray_DIM(p, 0), (Py_ssize_t)PyArray_DIM(p, 1));
        Py_DECREF(p);
        return NULL;
    }
    return p;
}

PyObject *orkpy_i4_layout(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t K = PyLong_AsSsize_t(arg);
    if (K == -1 && PyErr_Occurred()) return NULL;
    if (check_k(K) < 0) return NULL;
    return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n}", "Kp", (Py_ssize_t)ork_i4_kpad((size_t)K), "row_bytes",
                         (Py_ssize_t)ork_i4_row_bytes((size_t)K), "kchunk", (Py_ssize_t)ORK_I4_KCHUNK, "n_chunks",
                         (Py_ssize_t)ork_i4_chunks((size_t)K), "max_k", (Py_ssize_t)ORK_I4_MAX_K);
}

PyObject *orkpy_i4_pack(PyObject *self, PyObject *arg) {
    (void)self;
    PyArrayObject *codes = orkpy_as_exact(arg, NPY_INT8, 2, "codes"), *out = NULL;
    if (!codes) return NULL;
    const npy_intp rows = PyArray_DIM(codes, 0), K = PyArray_DIM(codes, 1);
    if (check_k(K) < 0) goto fail;
    npy_intp dims[2] = {rows, (npy_intp)ork_i4_row_bytes((size_t)K)};
    if (!(out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_UINT8))) goto fail;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_i4_pack((const int8_t *)PyArray_DATA(codes), (size_t)rows, (size_t)K, (size_t)K,
                     (uint8_t *)PyArray_DATA(out), &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        orkpy_raise_named(st, "codes", &err);
        goto fail;
    }
    Py_DECREF(codes);
    return (PyObject *)out;
fail:
    Py_DECREF(codes);
    Py_XDECREF(out);
    return NULL;
}

PyObject *orkpy_i4_unpack(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *p_obj;
    Py_ssize_t K;
    if (!PyArg_ParseTuple(args, "On:i4_unpack", &p_obj, &K) || check_k(K) < 0) return NULL;
    PyArrayObject *p = as_stored(p_obj, K, "packed"), *out = NULL;
    if (!p) return NULL;
    npy_intp dims[2] = {PyArray_DIM(p, 0), (npy_intp)K};
    if (!(out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_INT8))) goto fail;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_i4_unpack((const uint8_t *)PyArray_DATA(p), (size_t)dims[0], (size_t)K, (size_t)K,
                                  (int8_t *)PyArray_DATA(out), &err);
    if (st != ORK_OK) {
        orkpy_raise_named(st, "packed", &err);
        goto fail;
    }
    Py_DECREF(p);
    return (PyObject *)out;
fail:
    Py_DECREF(p);
    Py_XDECREF(out);
    return NULL;
}

/* mm_i4(a, w, K, threads=0) -> int32 (M, N); mm_i4_partials(a, w, K) -> int16 (n_chunks, M, N) */
static PyObject *mm_common(PyObject *args, PyObject *kw, int partials) {
    static char *kwlist[] = {"a", "w", "K", "threads", NULL};
    static char *kwlist_p[] = {"a", "w", "K", NULL};
    PyObject *a_obj, *w_obj;
    Py_ssize_t K;
    int threads = 0;
    if (!(partials ? PyArg_ParseTupleAndKeywords(args, kw, "OOn:mm_i4_partials", kwlist_p, &a_obj, &w_obj, &K)
                   : PyArg_ParseTupleAndKeywords(args, kw, "OOn|i:mm_i4", kwlist, &a_obj, &w_obj, &K, &threads)))
        return NULL;
    if (check_k(K) < 0 || orkpy_check_threads(threads) < 0) return NULL;
    PyArrayObject *a = NULL, *w = NULL, *out = NULL;
    PyObject *result = NULL;
    if (!(a = as_stored(a_obj, K, "a")) || !(w = as_stored(w_obj, K, "w"))) goto done;
    const size_t M = (size_t)PyArray_DIM(a, 0), N = (size_t)PyArray_DIM(w, 0);
    npy_intp dims[3] = {(npy_intp)ork_i4_chunks((size_t)K), (npy_intp)M, (npy_intp)N};
    if (!(out = (PyArrayObject *)(partials ? PyArray_SimpleNew(3, dims, NPY_INT16)
                                           : PyArray_SimpleNew(2, dims + 1, NPY_INT32))))
        goto done;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    const uint8_t *ap = (const uint8_t *)PyArray_DATA(a), *wp = (const uint8_t *)PyArray_DATA(w);
    Py_BEGIN_ALLOW_THREADS
    st = partials ? ork_mm_i4_partials(ap, M, wp, N, (size_t)K, (int16_t *)PyArray_DATA(out), &err)
                  : ork_mm_i4(ap, M, wp, N, (size_t)K, (int32_t *)PyArray_DATA(out), threads, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = (PyObject *)out;
    out = NULL;
done:
    Py_XDECREF(a);
    Py_XDECREF(w);
    Py_XDECREF(out);
    return result;
}

PyObject *orkpy_mm_i4(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return mm_common(args, kw, 0);
}

PyObject *orkpy_mm_i4_partials(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return mm_common(args, kw, 1);
}
