/* py_gptq.c - binding of GPTQ rounding (csrc/ork/gptq.h). Same shape as every
 * binding: parse, coerce, release the GIL, call the core, map the status. */
#include "numpy_api.h"

#include <string.h>

#include "../ork/gptq.h"
#include "../ork/hadamard.h"
#include "bindings.h"
#include "errors.h"

/* a float64, C-contiguous, aligned copy/view of a floating-point (K, K) array */
static PyArrayObject *as_square_f64(PyObject *obj, Py_ssize_t K, const char *name) {
    PyArrayObject *arr = (PyArrayObject *)PyArray_FROM_O(obj);
    if (!arr) return NULL;
    if (!PyArray_ISFLOAT(arr)) {
        PyErr_Format(PyExc_TypeError, "%s must be a floating-point array, got dtype %S", name,
                     (PyObject *)PyArray_DESCR(arr));
        Py_DECREF(arr);
        return NULL;
    }
    if (PyArray_NDIM(arr) != 2 || (K >= 0 && (PyArray_DIM(arr, 0) != K || PyArray_DIM(arr, 1) != K)) ||
        (K < 0 && PyArray_DIM(arr, 0) != PyArray_DIM(arr, 1))) {
        PyObject *shape = PyObject_GetAttrString((PyObject *)arr, "shape");
        if (K >= 0)
            PyErr_Format(PyExc_ValueError, "%s must be (%zd, %zd) for a weight with K = %zd, got %S", name, K, K, K,
                         shape);
        else
            PyErr_Format(PyExc_ValueError, "%s must be a square 2-D array, got shape %S", name, shape);
        Py_XDECREF(shape);
        Py_DECREF(arr);
        return NULL;
    }
    PyArrayObject *out = (PyArrayObject *)PyArray_FROM_OTF((PyObject *)arr, NPY_FLOAT64,
                                                           NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    Py_DECREF(arr);
    return out;
}

PyObject *orkpy_gptq(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"w",     "gram",          "kind",    "damp",           "block", "rows",
                             "group", "static_groups", "threads", "overwrite_gram", "precision", "affine", NULL};
    PyObject *w_obj, *g_obj;
    const char *kind_s;
    double damp = 0.01;
    Py_ssize_t block = 128, rows = 0, group = 0;
    int static_groups = 0, threads = 0, overwrite = 0, affine = 0;
    const char *prec_s = "float64";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOs|dnnnpipsp:gptq", kwlist, &w_obj, &g_obj, &kind_s, &damp, &block,
                                     &rows, &group, &static_groups, &threads, &overwrite, &prec_s, &affine))
        return NULL;
    ork_gptq_prec prec;
    if (strcmp(prec_s, "float64") == 0) prec = ORK_GPTQ_F64;
    else if (strcmp(prec_s, "float32") == 0) prec = ORK_GPTQ_F32;
    else return PyErr_Format(PyExc_ValueError, "precision must be 'float32' or 'float64', got '%s'", prec_s);
    if (block < 1) return PyErr_Format(PyExc_ValueError, "block must be >= 1, got %zd", block);
    if (rows < 0) return PyErr_Format(PyExc_ValueError, "rows must be >= 0, got %zd", rows);
    if (group < 0) return PyErr_Format(PyExc_ValueError, "group size must be >= 0, got %zd", group);
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || orkpy_check_threads(threads) < 0) return NULL;
    PyArrayObject *w = NULL, *g = NULL, *codes = NULL, *scales = NULL, *offsets = NULL;
    PyObject *result = NULL;
    if (!(w = orkpy_as_float32(w_obj, 2, "w"))) goto done;
    const npy_intp N = PyArray_DIM(w, 0), K = PyArray_DIM(w, 1);
    if (!(g = as_square_f64(g_obj, (Py_ssize_t)K, "the Gram matrix"))) goto done;
    /* overwrite_gram: the caller allows its Gram matrix (a float64 C-contiguous one, else the
     * converted copy) to be the workspace, destroyed; a read-only one is left alone */
    const int consume = overwrite && PyArray_ISWRITEABLE(g);
    ork_gptq_params p;
    memset(&p, 0, sizeof p);
    p.kind = ki->id;
    p.damp = damp;
    p.block = (size_t)block;
    p.rows = (size_t)rows;
    p.group = group < K ? (size_t)group : 0; /* a group of K or more is one scale per row */
    p.static_groups = static_groups;
    p.nthreads = threads;
    p.precision = prec;
    npy_intp cdims[2] = {N, (npy_intp)ork_quant_row_bytes(p.kind, (size_t)K)};
    npy_intp sdims[2] = {N, (npy_intp)ork_group_count((size_t)K, p.group)};
    codes = (PyArrayObject *)PyArray_SimpleNew(2, cdims, orkpy_code_typenum(ki));
    scales = (PyArrayObject *)PyArray_SimpleNew(p.group ? 2 : 1, sdims, NPY_FLOAT32);
    if (!codes || !scales) goto done;
    if (affine) { /* the checks (kind, group) are ork_gptq's */
        if (!(offsets = (PyArrayObject *)PyArray_SimpleNew(p.group ? 2 : 1, sdims, NPY_FLOAT32))) goto done;
        p.offsets = (float *)PyArray_DATA(offsets);
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    if (consume)
        st = ork_gptq_consume((const float *)PyArray_DATA(w), (size_t)N, (size_t)K, (double *)PyArray_DATA(g), &p,
                              PyArray_DATA(codes), (float *)PyArray_DATA(scales), &err);
    else
        st = ork_gptq((const float *)PyArray_DATA(w), (size_t)N, (size_t)K, (const double *)PyArray_DATA(g), &p,
                      PyArray_DATA(codes), (float *)PyArray_DATA(scales), &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = offsets ? Py_BuildValue("(OOO)", codes, scales, offsets) : Py_BuildValue("(OO)", codes, scales);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(w);
    Py_XDECREF(g);
    Py_XDECREF(codes);
    Py_XDECREF(scales);
    return result;
}

PyObject *orkpy_gptq_factor(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"h", "threads", NULL};
    PyObject *h_obj;
    int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i:gptq_factor", kwlist, &h_obj, &threads)) return NULL;
    if (orkpy_check_threads(threads) < 0) return NULL;
    PyArrayObject *h = as_square_f64(h_obj, -1, "h"), *u = NULL;
    if (!h) return NULL;
    const npy_intp K = PyArray_DIM(h, 0);
    if (K == 0) {
        Py_DECREF(h);
        return PyErr_Format(PyExc_ValueError, "h must be non-empty");
    }
    npy_intp dims[2] = {K, K};
    if (!(u = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT64))) {
        Py_DECREF(h);
        return NULL;
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_gptq_factor((const double *)PyArray_DATA(h), (size_t)K, threads, (double *)PyArray_DATA(u), &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(h);
    if (st != ORK_OK) {
        Py_DECREF(u);
        return orkpy_raise(st, &err);
    }
    return (PyObject *)u;
}

/* hadamard_rows(x, hp, scale, threads=0) -> None: x (float64, C-contiguous, writeable, (rows, p * m)) becomes
 * scale * x @ kron(hp, H_m) in place (csrc/ork/hadamard.h); hp a (p, p) float64 array or None (p = 1) */
PyObject *orkpy_hadamard_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *hpo;
    double scale;
    int threads = 0;
    if (!PyArg_ParseTuple(args, "OOd|i:hadamard_rows", &xo, &hpo, &scale, &threads) ||
        orkpy_check_threads(threads) < 0)
        return NULL;
    if (!PyArray_Check(xo) || PyArray_TYPE((PyArrayObject *)xo) != NPY_FLOAT64 ||
        PyArray_NDIM((PyArrayObject *)xo) != 2 || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)xo) ||
        !PyArray_ISWRITEABLE((PyArrayObject *)xo) || !PyArray_ISALIGNED((PyArrayObject *)xo)) {
        PyErr_SetString(PyExc_TypeError, "x must be a writeable, aligned, C-contiguous 2-D float64 array");
        return NULL;
    }
    PyArrayObject *x = (PyArrayObject *)xo, *hp = NULL;
    size_t p = 1, n = (size_t)PyArray_DIM(x, 1);
    if (hpo != Py_None) {
        if (!(hp = orkpy_as_exact(hpo, NPY_FLOAT64, 2, "hp"))) return NULL;
        p = (size_t)PyArray_DIM(hp, 0);
        if (PyArray_DIM(hp, 1) != PyArray_DIM(hp, 0) || p == 0 || n % p != 0) {
            PyErr_Format(PyExc_ValueError, "hp must be (p, p) with p dividing x's %zu columns, got (%zd, %zd)", n,
                         (Py_ssize_t)PyArray_DIM(hp, 0), (Py_ssize_t)PyArray_DIM(hp, 1));
            Py_DECREF(hp);
            return NULL;
        }
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_hadamard_rows_f64((double *)PyArray_DATA(x), (size_t)PyArray_DIM(x, 0), p, n / p,
                               hp ? (const double *)PyArray_DATA(hp) : NULL, scale, threads, &err);
    Py_END_ALLOW_THREADS
    Py_XDECREF(hp);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    Py_RETURN_NONE;
}
