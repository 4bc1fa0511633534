/* coerce.c - argument coercion shared by every binding file: arrays are
 * checked for dtype and ndim, then cast/copied to the core's layout. */
#include "numpy_api.h"

#include <stdio.h>
#include <string.h>

#include "bindings.h"
#include "errors.h"

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


/* ------------------------------------------------------------- dicts -- */

/* 0 when every key of dict d is one of keys (NULL-terminated), else -1 with a ValueError naming it */
int orkpy_dict_keys_in(PyObject *d, const char *const *keys, const char *what) {
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "%s must be a dict, got %s", what, Py_TYPE(d)->tp_name);
        return -1;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &k, &v)) {
        const char *s = PyUnicode_Check(k) ? PyUnicode_AsUTF8(k) : NULL;
        int known = 0;
        for (size_t i = 0; s && keys[i]; i++) known |= strcmp(s, keys[i]) == 0;
        if (!known) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: unknown key %R", what, k);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------- activation spec -- */

/* obj[key] (absent or None: *out unchanged) as a count >= 0; -1 with a ValueError naming `what` */
static int spec_count(PyObject *obj, const char *key, const char *name, const char *what, size_t *out) {
    PyObject *v = PyDict_GetItemString(obj, key);
    if (!v || v == Py_None) return 0;
    Py_ssize_t c = PyLong_AsSsize_t(v);
    if (c < 0) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: %s must be >= 0, got %zd", name, what, c);
        return -1;
    }
    *out = (size_t)c;
    return 0;
}

int orkpy_act_spec_from_py(PyObject *obj, size_t K, ork_act_spec *spec, PyObject **keep, const char *name) {
    static const char *const keys[] = {"mode", "bits", "clip", "prefix", "outliers", "search", "digits", "group", NULL};
    const ork_act_spec init = ORK_ACT_SPEC_INIT;
    *spec = init;
    *keep = NULL;
    if (obj == Py_None) return 0;
    char what[96];
    snprintf(what, sizeof what, "%s: the activation spec", name);
    if (orkpy_dict_keys_in(obj, keys, what) < 0) return -1;
    PyObject *v;
    if ((v = PyDict_GetItemString(obj, "mode"))) {
        const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
        const ork_act_mode_info *row = s ? ork_act_mode_find(s) : NULL;
        if (!row) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: unknown activation mode %R", name, v);
            return -1;
        }
        spec->mode = row->id;
    }
    if ((v = PyDict_GetItemString(obj, "bits"))) {
        long b = PyLong_AsLong(v);
        if (b == -1 && PyErr_Occurred()) return -1;
        if (b < -1024 || b > 1024) {
            PyErr_Format(PyExc_ValueError, "%s: activation bits %ld out of range", name, b);
            return -1;
        }
        spec->bits = (int)b;
    }
    if ((v = PyDict_GetItemString(obj, "clip")) && v != Py_None) {
        double c = PyFloat_AsDouble(v);
        if (c == -1.0 && PyErr_Occurred()) return -1;
        spec->clip = (float)c; /* rounded to float32; a nonzero value that rounds to 0 is refused here */
        if (c != 0.0 && spec->clip == 0.0f) {
            PyErr_Format(PyExc_ValueError, "%s: static activation range %R underflows float32", name, v);
            return -1;
        }
    }
    if ((v = PyDict_GetItemString(obj, "search")) && v != Py_None) {
        int t = PyObject_IsTrue(v);
        if (t < 0) return -1;
        spec->search = t;
    }
    if ((v = PyDict_GetItemString(obj, "digits")) && v != Py_None) {
        int t = PyObject_IsTrue(v);
        if (t < 0) return -1;
        spec->digits = t;
    }
    if (spec_count(obj, "group", name, "activation group", &spec->group) < 0) return -1;
    if (spec_count(obj, "prefix", name, "act prefix", &spec->prefix) < 0) return -1;
    PyArrayObject *o = NULL;
    if ((v = PyDict_GetItemString(obj, "outliers")) && v != Py_None) {
        if (!(o = orkpy_as_exact(v, NPY_INT32, 1, "outliers"))) return -1;
        spec->outliers = (const int32_t *)PyArray_DATA(o);
        spec->n_outliers = (size_t)PyArray_DIM(o, 0);
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_act_spec_check(spec, K, &err);
    if (st != ORK_OK) {
        Py_XDECREF(o);
        orkpy_raise_named(st, name, &err);
        return -1;
    }
    *keep = (PyObject *)o;
    return 0;
}
