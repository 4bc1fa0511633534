/* py_gguf.c - binding of the GGUF parser: turns a validated ork_gguf into
 * Python objects. Values are built through the core's visitor, so only bytes
 * the parser has accepted are ever read. */
#include "numpy_api.h"

#include <string.h>

#include "../ork/dequant.h"
#include "../ork/ggml_types.h"
#include "../ork/gguf.h"
#include "bindings.h"
#include "errors.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "orkpy's GGUF binding assumes a little-endian host"
#endif

typedef struct {
    PyObject *stack[ORK_GGUF_MAX_DEPTH + 2];
    int depth;
    PyObject *result;
} build_ctx;

static int push_value(build_ctx *b, PyObject *o) {
    if (!o) return -1;
    if (b->depth > 0) {
        int r = PyList_Append(b->stack[b->depth - 1], o);
        Py_DECREF(o);
        return r < 0 ? -1 : 0;
    }
    Py_XDECREF(b->result);
    b->result = o;
    return 0;
}

static int v_scalar(void *ctx, uint32_t type, const uint8_t *p) {
    build_ctx *b = (build_ctx *)ctx;
    PyObject *o = NULL;
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; float f32;
            uint64_t u64; int64_t i64; double f64; } v;
    memcpy(&v, p, ork_gguf_scalar_size(type));
    switch (type) {
    case ORK_GGUF_UINT8: o = PyLong_FromUnsignedLong(v.u8); break;
    case ORK_GGUF_INT8: o = PyLong_FromLong(v.i8); break;
    case ORK_GGUF_UINT16: o = PyLong_FromUnsignedLong(v.u16); break;
    case ORK_GGUF_INT16: o = PyLong_FromLong(v.i16); break;
    case ORK_GGUF_UINT32: o = PyLong_FromUnsignedLong(v.u32); break;
    case ORK_GGUF_INT32: o = PyLong_FromLong(v.i32); break;
    case ORK_GGUF_FLOAT32: o = PyFloat_FromDouble(v.f32); break;
    case ORK_GGUF_BOOL: o = PyBool_FromLong(v.u8); break;
    case ORK_GGUF_UINT64: o = PyLong_FromUnsignedLongLong(v.u64); break;
    case ORK_GGUF_INT64: o = PyLong_FromLongLong(v.i64); break;
    case ORK_GGUF_FLOAT64: o = PyFloat_FromDouble(v.f64); break;
    default: PyErr_SetString(PyExc_RuntimeError, "unexpected GGUF scalar type"); return -1;
    }
    return push_value(b, o);
}

static int v_string(void *ctx, const uint8_t *p, uint64_t len) {
    return push_value((build_ctx *)ctx,
                      PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)len, "surrogateescape"));
}

static int npy_type_of(uint32_t t) {
    switch (t) {
    case ORK_GGUF_UINT8: return NPY_UINT8;
    case ORK_GGUF_INT8: return NPY_INT8;
    case ORK_GGUF_UINT16: return NPY_UINT16;
    case ORK_GGUF_INT16: return NPY_INT16;
    case ORK_GGUF_UINT32: return NPY_UINT32;
    case ORK_GGUF_INT32: return NPY_INT32;
    case ORK_GGUF_FLOAT32: return NPY_FLOAT32;
    case ORK_GGUF_BOOL: return NPY_BOOL;
    case ORK_GGUF_UINT64: return NPY_UINT64;
    case ORK_GGUF_INT64: return NPY_INT64;
    case ORK_GGUF_FLOAT64: return NPY_FLOAT64;
    default: return -1;
    }
}

static int v_numeric_array(void *ctx, uint32_t et, const uint8_t *p, uint64_t count) {
    npy_intp n = (npy_intp)count;
    PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(1, &n, npy_type_of(et));
    if (!a) return -1;
    if (count) memcpy(PyArray_DATA(a), p, (size_t)count * ork_gguf_scalar_size(et));
    return push_value((build_ctx *)ctx, (PyObject *)a);
}

static int v_array_begin(void *ctx, uint32_t et, uint64_t count) {
    build_ctx *b = (build_ctx *)ctx;
    (void)et;
    if (b->depth >= ORK_GGUF_MAX_DEPTH + 1) {
        PyErr_SetString(PyExc_RuntimeError, "GGUF array nesting too deep");
        return -1;
    }
    PyObject *l = PyList_New(0);
    if (!l) return -1;
    (void)count;
    b->stack[b->depth++] = l;
    return 0;
}

static int v_array_end(void *ctx) {
    build_ctx *b = (build_ctx *)ctx;
    PyObject *l = b->stack[--b->depth];
    return push_value(b, l);
}

static PyObject *build_value(const uint8_t *buf, size_t len, uint32_t type, uint64_t off) {
    build_ctx b;
    memset(&b, 0, sizeof b);
    ork_gguf_visitor v = {&b, v_scalar, v_string, v_numeric_array, v_array_begin, v_array_end};
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_gguf_visit_value(buf, len, type, off, &v, &err);
    if (st != ORK_OK) {
        while (b.depth > 0) Py_DECREF(b.stack[--b.depth]);
        Py_XDECREF(b.result);
        if (PyErr_Occurred()) return NULL; /* a Python error raised inside a callback */
        return orkpy_raise(st, &err);
    }
    return b.result;
}

PyObject *orkpy_gguf_parse(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *buf = (const uint8_t *)view.buf;
    size_t len = (size_t)view.len;
    ork_gguf g;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_gguf_parse(buf, len, &g, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        PyBuffer_Release(&view);
        return orkpy_raise(st, &err);
    }
    PyObject *kvs = PyList_New(0), *tensors = PyList_New(0), *result = NULL;
    if (!kvs || !tensors) goto done;
    for (uint64_t i = 0; i < g.n_kv; i++) {
        const ork_gguf_kv *kv = &g.kv[i];
        PyObject *val = build_value(buf, len, kv->type, kv->value_off);
        if (!val) goto done;
        PyObject *item = Py_BuildValue("(s#sN)", (const char *)buf + kv->key_off, (Py_ssize_t)kv->key_len,
                                       ork_gguf_type_name(kv->type), val);
        if (!item || PyList_Append(kvs, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const ork_gguf_tensor *t = &g.tensors[i];
        PyObject *ne = PyTuple_New(t->n_dims);
        if (!ne) goto done;
        for (uint32_t d = 0; d < t->n_dims; d++) PyTuple_SET_ITEM(ne, d, PyLong_FromUnsignedLongLong(t->ne[d]));
        PyObject *name = PyUnicode_DecodeUTF8((const char *)buf + t->name_off, (Py_ssize_t)t->name_len,
                                              "surrogateescape");
        if (!name) {
            Py_DECREF(ne);
            goto done;
        }
        PyObject *item = Py_BuildValue("(NINKKKK)", name, (unsigned)t->type, ne,
                                       (unsigned long long)t->offset, (unsigned long long)t->data_off,
                                       (unsigned long long)t->nbytes, (unsigned long long)t->info_off);
        if (!item || PyList_Append(tensors, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    result = Py_BuildValue("{s:I,s:K,s:K,s:O,s:O}", "version", (unsigned)g.version, "alignment",
                           (unsigned long long)g.alignment, "data_offset", (unsigned long long)g.data_off,
                           "metadata", kvs, "tensors", tensors);
done:
    Py_XDECREF(kvs);
    Py_XDECREF(tensors);
    ork_gguf_free(&g);
    PyBuffer_Release(&view);
    return result;
}

/* find_nonfinite(a, threads=0) -> int: the flat index of a's first NaN / +-Inf (float32 or float16, any
 * shape; a non-contiguous array is copied first), -1 when every value is finite. The GIL is released while
 * it scans, on up to `threads` threads (<= 0: all cores). */
PyObject *orkpy_find_nonfinite(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"a", "threads", NULL};
    PyObject *arg;
    int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i:find_nonfinite", kwlist, &arg, &threads)) return NULL;
    if (orkpy_check_threads(threads) < 0) return NULL;
    if (!PyArray_Check(arg)) return PyErr_Format(PyExc_TypeError, "find_nonfinite expects a NumPy array, got %s",
                                                 Py_TYPE(arg)->tp_name);
    int t = PyArray_TYPE((PyArrayObject *)arg);
    if (t != NPY_FLOAT32 && t != NPY_FLOAT16)
        return PyErr_Format(PyExc_TypeError, "find_nonfinite expects a float32 or float16 array, got %S",
                            (PyObject *)PyArray_DESCR((PyArrayObject *)arg));
    PyArrayObject *a = (PyArrayObject *)PyArray_FROM_OTF(arg, t, NPY_ARRAY_IN_ARRAY);
    if (!a) return NULL;
    size_t n = (size_t)PyArray_SIZE(a), at;
    const void *data = PyArray_DATA(a);
    Py_BEGIN_ALLOW_THREADS
    at = ork_find_nonfinite_par(data, n, t == NPY_FLOAT32 ? ORK_FINITE_F32 : ORK_FINITE_F16, threads);
    Py_END_ALLOW_THREADS
    Py_DECREF(a);
    return PyLong_FromSsize_t(at == n ? -1 : (Py_ssize_t)at);
}
