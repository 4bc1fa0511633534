/* coerce.c - argument coercion shared by every binding file: arrays are
 * checked for dtype and ndim, then cast/copied to the core's layout. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL orkpy_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <string.h>

#include "bindings.h"

/* ---------------------------------------------------------- coercion -- */

/* A float32, C-contiguous, aligned copy/view of `obj` with `ndim` dims.
 * Non-floating dtypes raise TypeError; wrong ndim raises ValueError. */
PyArrayObject *orkpy_as_float32(PyObject *obj, int ndim, const char *name) {
    PyArrayObject *arr = (PyArrayObject *)PyArray_FROM_O(obj);
    if (!arr) return NULL;
    if (!PyArray_ISFLOAT(arr)) {
        PyErr_Format(PyExc_TypeError, "%s must be a floating-point array (float32 or float16), got dtype %S",
                     name, (PyObject *)PyArray_DESCR(arr));
        Py_DECREF(arr);
        return NULL;
    }
    if (PyArray_NDIM(arr) != ndim) {
        PyErr_Format(PyExc_ValueError, "%s must be %d-D, got %d-D", name, ndim, PyArray_NDIM(arr));
        Py_DECREF(arr);
        return NULL;
    }
    PyArrayObject *out = (PyArrayObject *)PyArray_FROM_OTF((PyObject *)arr, NPY_FLOAT32,
                                                           NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    Py_DECREF(arr);
    return out;
}

/* An exact-dtype, C-contiguous array (no value-changing casts). */
PyArrayObject *orkpy_as_exact(PyObject *obj, int typenum, int ndim, const char *name) {
    PyArrayObject *arr = (PyArrayObject *)PyArray_FROM_O(obj);
    if (!arr) return NULL;
    if (PyArray_TYPE(arr) != typenum || PyArray_NDIM(arr) != ndim) {
        PyArray_Descr *want = PyArray_DescrFromType(typenum);
        PyErr_Format(PyExc_TypeError, "%s must be a %d-D %S array, got %d-D %S", name, ndim,
                     (PyObject *)want, PyArray_NDIM(arr), (PyObject *)PyArray_DESCR(arr));
        Py_XDECREF(want);
        Py_DECREF(arr);
        return NULL;
    }
    PyArrayObject *out = (PyArrayObject *)PyArray_FROM_OTF((PyObject *)arr, typenum, NPY_ARRAY_IN_ARRAY);
    Py_DECREF(arr);
    return out;
}

/* the registry row named s (quant.h), or NULL with a ValueError listing the kinds */
const ork_kind_info *orkpy_parse_kind(const char *s) {
    const ork_kind_info *k = ork_kind_find(s);
    if (k) return k;
    char names[ORK_KIND_MAX * (ORK_KIND_NAME_MAX + 2)] = "";
    for (size_t i = 0, n = ork_kind_count(); i < n; i++) {
        const ork_kind_info *r = ork_kind_get((ork_kind)i);
        if (!r) continue;
        if (names[0]) strcat(names, ", ");
        strcat(names, r->name);
    }
    PyErr_Format(PyExc_ValueError, "unknown kind '%s' (expected one of %s)", s, names);
    return NULL;
}

int orkpy_code_typenum(const ork_kind_info *k) { return k->bits == 8 ? NPY_INT8 : NPY_UINT8; }

int orkpy_check_threads(int threads) {
    if (threads < 0) {
        PyErr_Format(PyExc_ValueError, "threads must be >= 0 (0 = all cores), got %d", threads);
        return -1;
    }
    return 0;
}

