/* py_pack.c - binding of packed weights (pack.h), the matmul drivers and the
 * O4N1/O8N1 header codec (o4n1.h). Same shape as every binding: parse,
 * coerce, release the GIL, call the core, map the status. */
#include "numpy_api.h"

#include <string.h>

#include "../ork/affine.h"
#include "../ork/half.h"
#include "../ork/o4n1.h"
#include "../ork/linear.h"
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

/* the store array of a packed weight: exactly the dtype and shape of ork_pack_store_shape */
PyArrayObject *orkpy_as_store(PyObject *obj, const ork_kind_info *k, Py_ssize_t N, Py_ssize_t K, const char *name) {
    PyArrayObject *a = orkpy_as_exact(obj, orkpy_code_typenum(k), 4, name);
    if (!a) return NULL;
    size_t want[4];
    ork_pack_store_shape(k->id, (size_t)N, (size_t)K, want);
    for (int d = 0; d < 4; d++)
        if (PyArray_DIM(a, d) != (npy_intp)want[d]) {
            PyErr_Format(PyExc_ValueError, "%s has shape (%zd, %zd, %zd, %zd), expected (%zu, %zu, %zu, %zu) for N = %zd, K = %zd",
                         name, (Py_ssize_t)PyArray_DIM(a, 0), (Py_ssize_t)PyArray_DIM(a, 1), (Py_ssize_t)PyArray_DIM(a, 2),
                         (Py_ssize_t)PyArray_DIM(a, 3), want[0], want[1], want[2], want[3], N, K);
            Py_DECREF(a);
            return NULL;
        }
    return a;
}

/* the scales of a packed weight: float32 (N,) for per-channel scales (group 0 or >= K), (N, G) for
 * group-wise scales; *G set. NULL with a ValueError/TypeError naming the problem. */
static PyArrayObject *as_bscale(PyObject *obj, Py_ssize_t N, Py_ssize_t K, Py_ssize_t group, size_t *G) {
    if (group < 0 || (group && (group % 32 || group > ORK_GROUP_MAX))) {
        PyErr_Format(PyExc_ValueError, "group size %zd is not a multiple of 32 in [32, %d] (or 0: per channel)", group,
                     ORK_GROUP_MAX);
        return NULL;
    }
    *G = group && group < K ? ork_group_count((size_t)K, (size_t)group) : 1;
    PyArrayObject *bs = orkpy_as_exact(obj, NPY_FLOAT32, *G > 1 ? 2 : 1, "bscale");
    if (!bs) return NULL;
    if (PyArray_DIM(bs, 0) != N || (*G > 1 && (size_t)PyArray_DIM(bs, 1) != *G)) {
        if (*G > 1)
            PyErr_Format(PyExc_ValueError, "bscale has shape (%zd, %zd), expected (N, G) = (%zd, %zu) for K = %zd, group %zd",
                         (Py_ssize_t)PyArray_DIM(bs, 0), (Py_ssize_t)PyArray_DIM(bs, 1), N, *G, K, group);
        else
            PyErr_Format(PyExc_ValueError, "bscale has %zd entries, expected N = %zd", (Py_ssize_t)PyArray_DIM(bs, 0), N);
        Py_DECREF(bs);
        return NULL;
    }
    return bs;
}

PyObject *orkpy_pack(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"codes", "kind", "N", "K", NULL};
    PyObject *c_obj;
    const char *kind_s;
    Py_ssize_t N, K;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Osnn:pack", kwlist, &c_obj, &kind_s, &N, &K)) return NULL;
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || check_nk(N, K) < 0) return NULL;
    PyArrayObject *codes = NULL, *store = NULL;
    PyObject *result = NULL;
    if (!(codes = orkpy_as_exact(c_obj, orkpy_code_typenum(ki), 2, "codes"))) goto done;
    if (PyArray_DIM(codes, 0) != N || PyArray_DIM(codes, 1) != (npy_intp)ork_quant_row_bytes(ki->id, (size_t)K)) {
        PyErr_Format(PyExc_ValueError, "codes do not fit kind '%s' with N = %zd, K = %zd", kind_s, N, K);
        goto done;
    }
    size_t shape[4];
    ork_pack_store_shape(ki->id, (size_t)N, (size_t)K, shape);
    npy_intp dims[4] = {(npy_intp)shape[0], (npy_intp)shape[1], (npy_intp)shape[2], (npy_intp)shape[3]};
    if (!(store = (PyArrayObject *)PyArray_SimpleNew(4, dims, orkpy_code_typenum(ki)))) goto done;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_pack(ki->id, PyArray_DATA(codes), (size_t)N, (size_t)K, PyArray_DATA(store), &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = (PyObject *)store;
    store = NULL;
done:
    Py_XDECREF(codes);
    Py_XDECREF(store);
    return result;
}

PyObject *orkpy_unpack(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"store", "kind", "N", "K", NULL};
    PyObject *s_obj;
    const char *kind_s;
    Py_ssize_t N, K;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Osnn:unpack", kwlist, &s_obj, &kind_s, &N, &K)) return NULL;
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || check_nk(N, K) < 0) return NULL;
    PyArrayObject *store = NULL, *codes = NULL;
    PyObject *result = NULL;
    if (!(store = orkpy_as_store(s_obj, ki, N, K, "store"))) goto done;
    npy_intp dims[2] = {N, (npy_intp)ork_quant_row_bytes(ki->id, (size_t)K)};
    if (!(codes = (PyArrayObject *)PyArray_SimpleNew(2, dims, orkpy_code_typenum(ki)))) goto done;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_unpack(ki->id, PyArray_DATA(store), (size_t)N, (size_t)K, PyArray_DATA(codes), &err);
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = (PyObject *)codes;
    codes = NULL;
done:
    Py_XDECREF(store);
    Py_XDECREF(codes);
    return result;
}

PyObject *orkpy_matmul_int(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"store", "kind", "N", "K", "xq", "threads", "group", NULL};
    PyObject *s_obj, *x_obj;
    const char *kind_s;
    Py_ssize_t N, K, group = 0;
    int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsnnO|in:matmul_int", kwlist, &s_obj, &kind_s, &N, &K, &x_obj,
                                     &threads, &group))
        return NULL;
    if (group < 0) return PyErr_Format(PyExc_ValueError, "group size must be >= 0, got %zd", group);
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || check_nk(N, K) < 0 || orkpy_check_threads(threads) < 0) return NULL;
    const ork_kind kind = ki->id;
    PyArrayObject *store = NULL, *x = NULL, *out = NULL;
    PyObject *result = NULL;
    if (!(store = orkpy_as_store(s_obj, ki, N, K, "store"))) goto done;
    if (!(x = orkpy_as_exact(x_obj, NPY_INT8, 2, "xq"))) goto done;
    if (PyArray_DIM(x, 1) != K || PyArray_DIM(x, 0) < 1) {
        PyErr_Format(PyExc_ValueError, "xq must have shape (M >= 1, K = %zd), got (%zd, %zd)", K,
                     (Py_ssize_t)PyArray_DIM(x, 0), (Py_ssize_t)PyArray_DIM(x, 1));
        goto done;
    }
    npy_intp M = PyArray_DIM(x, 0);
    const size_t G = group && group < K ? ork_group_count((size_t)K, (size_t)group) : 1;
    npy_intp dims[3] = {(npy_intp)G, M, N};
    /* per channel: (M, N); grouped: (G, M, N), one int32 partial sum per group (pack.h) */
    if (!(out = (PyArrayObject *)PyArray_SimpleNew(G > 1 ? 3 : 2, G > 1 ? dims : dims + 1, NPY_INT32))) goto done;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_matmul_int_grouped(kind, PyArray_DATA(store), ork_quant_lut(kind), G > 1 ? (size_t)group : 0, (size_t)N,
                                (size_t)K, (const int8_t *)PyArray_DATA(x), (size_t)M, (int32_t *)PyArray_DATA(out),
                                threads, &err);
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

/* matmul(store, kind, N, K, bscale, x, act=None, threads=0, group=0): one packed linear in an
 * activation spec (act: ActSpec.to_core()'s dict, read by orkpy_act_spec_from_py; None = per token) */
PyObject *orkpy_matmul(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"store", "kind", "N", "K", "bscale", "x", "act", "threads", "group", "boffset", NULL};
    PyObject *s_obj, *b_obj, *x_obj, *a_obj = Py_None, *o_obj = Py_None;
    const char *kind_s;
    Py_ssize_t N, K;
    int threads = 0;
    Py_ssize_t group = 0;
    size_t G = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsnnOO|OinO:matmul", kwlist, &s_obj, &kind_s, &N, &K, &b_obj, &x_obj,
                                     &a_obj, &threads, &group, &o_obj))
        return NULL;
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || check_nk(N, K) < 0 || orkpy_check_threads(threads) < 0) return NULL;
    const ork_kind kind = ki->id;
    PyArrayObject *store = NULL, *bs = NULL, *x = NULL, *out = NULL, *bo = NULL;
    PyObject *result = NULL, *act_keep = NULL;
    ork_linear l; /* one packed linear in its activation spec (linear.h) */
    memset(&l, 0, sizeof l);
    if (orkpy_act_spec_from_py(a_obj, (size_t)K, &l.act, &act_keep, "matmul") < 0) goto done;
    if (!(store = orkpy_as_store(s_obj, ki, N, K, "store"))) goto done;
    if (!(bs = as_bscale(b_obj, N, K, group, &G))) goto done;
    if (o_obj != Py_None) {
        if (!(bo = orkpy_as_exact(o_obj, NPY_FLOAT32, 2, "boffset"))) goto done;
        if (PyArray_DIM(bo, 0) != N || (size_t)PyArray_DIM(bo, 1) != G) {
            PyErr_Format(PyExc_ValueError, "boffset has shape (%zd, %zd), expected bscale's (%zd, %zu)",
                         (Py_ssize_t)PyArray_DIM(bo, 0), (Py_ssize_t)PyArray_DIM(bo, 1), N, G);
            goto done;
        }
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
    if (bo && (st = ork_affine_check_offsets((const float *)PyArray_DATA(bo), (size_t)N, G, ORK_EINVAL, &err))) {
        orkpy_raise(st, &err);
        goto done;
    }
    l.path = ORK_LIN_PACKED;
    l.N = (size_t)N;
    l.K = (size_t)K;
    l.kind = kind;
    l.store = PyArray_DATA(store);
    l.bscale = (const float *)PyArray_DATA(bs);
    l.group = G > 1 ? (size_t)group : 0;
    l.boffset = bo ? (const float *)PyArray_DATA(bo) : NULL;
    Py_BEGIN_ALLOW_THREADS
    st = ork_linear_apply(&l, (const float *)PyArray_DATA(x), (size_t)M, (float *)PyArray_DATA(out), threads, &err);
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
    Py_XDECREF(bo);
    Py_XDECREF(x);
    Py_XDECREF(out);
    Py_XDECREF(act_keep);
    return result;
}

PyObject *orkpy_packed_header(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"kind", "N", "K", "group", "affine", NULL};
    const char *kind_s;
    Py_ssize_t N, K, group = 0;
    int affine = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "snn|np:packed_header", kwlist, &kind_s, &N, &K, &group, &affine))
        return NULL;
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || check_nk(N, K) < 0) return NULL;
    if (group < 0) return PyErr_Format(PyExc_ValueError, "group size must be >= 0, got %zd", group);
    uint8_t hdr[ORK_O4N1_HEADER_GROUPED];
    size_t hbytes = 0;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_o4n1_header(ki->id, (uint64_t)N, (uint64_t)K, (uint64_t)group, affine, hdr, &hbytes, &err);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    return PyBytes_FromStringAndSize((const char *)hdr, (Py_ssize_t)hbytes);
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
    return Py_BuildValue("{s:s,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:I,s:I,s:K}", "kind", ork_kind_get(info.kind)->name, "N",
                         (unsigned long long)info.N, "K", (unsigned long long)info.K, "scales_offset",
                         (unsigned long long)info.scales_off, "store_offset", (unsigned long long)info.store_off,
                         "store_bytes", (unsigned long long)info.store_bytes, "group", (unsigned long long)info.group,
                         "G", (unsigned long long)info.G, "version", (unsigned)info.version, "scale_bytes",
                         (unsigned)info.scale_bytes, "offsets_offset", (unsigned long long)info.offsets_off);
}

/* packed_check(store, kind, N, K, bscale): the door of PackedWeight(...): the
 * store's dtype and shape, its codes (no int8 -128) and the scales (finite,
 * >= +0, <= ork_pack_max_scale(K)); ValueError / TypeError naming the entry. */
PyObject *orkpy_packed_check(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"store", "kind", "N", "K", "bscale", "group", NULL};
    PyObject *s_obj, *b_obj;
    const char *kind_s;
    Py_ssize_t N, K, group = 0;
    size_t G = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsnnO|n:packed_check", kwlist, &s_obj, &kind_s, &N, &K, &b_obj, &group))
        return NULL;
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || check_nk(N, K) < 0) return NULL;
    const ork_kind kind = ki->id;
    PyArrayObject *store = NULL, *bs = NULL;
    PyObject *result = NULL;
    if (!(store = orkpy_as_store(s_obj, ki, N, K, "store"))) goto done;
    if (!(bs = as_bscale(b_obj, N, K, group, &G))) goto done;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_pack_check_store(kind, PyArray_DATA(store), (size_t)N, (size_t)K, &err);
    if (st == ORK_OK)
        st = ork_pack_check_gscales((const float *)PyArray_DATA(bs), (size_t)N, G, (size_t)K, ORK_EINVAL, &err);
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

/* packed_layout(kind, N, K) -> dict(kind, bits, store_shape, store_dtype,
 * store_bytes, magic, header_bytes, scales_offset, store_offset, file_bytes):
 * the layout facts of pack.h and o4n1.h, so Python never re-derives them. */
PyObject *orkpy_packed_layout(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"kind", "N", "K", "group", "affine", NULL};
    const char *kind_s;
    Py_ssize_t N, K, group = 0;
    int affine = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "snn|np:packed_layout", kwlist, &kind_s, &N, &K, &group, &affine))
        return NULL;
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || check_nk(N, K) < 0) return NULL;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = group < 0 ? ork_err_set(&err, ORK_EINVAL, "group size must be >= 0, got %zd", group)
                              : ork_group_check((size_t)group, &err);
    if (st == ORK_OK && affine) st = ork_affine_check(ki->id, (size_t)K, (size_t)group, &err);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    const int grouped = group && group < K;
    const size_t G = grouped ? ork_group_count((size_t)K, (size_t)group) : 1;
    const int hbytes = grouped ? ORK_O4N1_HEADER_GROUPED : ORK_O4N1_HEADER;
    size_t shape[4];
    ork_pack_store_shape(ki->id, (size_t)N, (size_t)K, shape);
    const size_t bytes = ork_pack_store_bytes(ki->id, (size_t)N, (size_t)K);
    const size_t fbytes = ork_pack_file_store_bytes(ki->id, (size_t)N, (size_t)K);
    const uint64_t soff = ork_o4n1_grouped_store_offset((uint64_t)N, (uint64_t)K, (uint64_t)group, affine);
    const int version = affine ? ORK_O4N1_VERSION_AFFINE : grouped ? ORK_O4N1_VERSION_F16 : ORK_O4N1_VERSION;
    return Py_BuildValue("{s:s,s:i,s:(nnnn),s:s,s:n,s:s,s:i,s:i,s:K,s:K,s:n,s:n,s:i,s:i,s:n,s:i,s:n}", "kind", ki->name, "bits", ki->bits,
                         "store_shape", (Py_ssize_t)shape[0], (Py_ssize_t)shape[1], (Py_ssize_t)shape[2],
                         (Py_ssize_t)shape[3], "store_dtype", ki->bits == 8 ? "int8" : "uint8", "store_bytes",
                         (Py_ssize_t)bytes, "magic", ork_o4n1_magic(ki->id), "header_bytes", hbytes,
                         "scales_offset", hbytes, "store_offset", (unsigned long long)soff, "file_bytes",
                         (unsigned long long)(soff + fbytes), "group", (Py_ssize_t)(grouped ? group : 0), "G",
                         (Py_ssize_t)G, "version", version, "scale_bytes",
                         grouped ? 2 : 4, "file_store_bytes", (Py_ssize_t)fbytes, "store_bits", ki->store_bits,
                         "offsets_offset", (Py_ssize_t)(affine ? hbytes + 2 * (Py_ssize_t)N * (Py_ssize_t)G : 0));
}

/* store_to_file(store, kind, N, K) -> bytes: the store as a file holds it (pack.h "Narrow file
 * stores": a bit stream for int6 / int5; the store's bytes for every other kind). ValueError
 * naming a code outside the kind's range. */
PyObject *orkpy_store_to_file(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *s_obj;
    const char *kind_s;
    Py_ssize_t N, K;
    if (!PyArg_ParseTuple(args, "Osnn:store_to_file", &s_obj, &kind_s, &N, &K)) return NULL;
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || check_nk(N, K) < 0) return NULL;
    PyArrayObject *store = orkpy_as_store(s_obj, ki, N, K, "store");
    if (!store) return NULL;
    const size_t nb = ork_pack_store_bytes(ki->id, (size_t)N, (size_t)K);
    const size_t fb = ork_pack_file_store_bytes(ki->id, (size_t)N, (size_t)K);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)fb);
    if (!out) {
        Py_DECREF(store);
        return NULL;
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ORK_OK;
    Py_BEGIN_ALLOW_THREADS
    if (fb == nb) memcpy(PyBytes_AS_STRING(out), PyArray_DATA(store), nb);
    else st = ork_pack_bits(ki->id, (const int8_t *)PyArray_DATA(store), nb, (uint8_t *)PyBytes_AS_STRING(out), &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(store);
    if (st != ORK_OK) {
        Py_DECREF(out);
        return orkpy_raise(st, &err);
    }
    return out;
}

/* store_padding_check(store, kind, N, K) -> None: the in-memory store's padding lanes hold the zero code
 * (pack.h ork_pack_check_padding), else ValueError naming the lane; save_packed's door (a file holding another
 * code in a padding lane does not load). */
PyObject *orkpy_store_padding_check(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *s_obj;
    const char *kind_s;
    Py_ssize_t N, K;
    if (!PyArg_ParseTuple(args, "Osnn:store_padding_check", &s_obj, &kind_s, &N, &K)) return NULL;
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || check_nk(N, K) < 0) return NULL;
    PyArrayObject *store = orkpy_as_store(s_obj, ki, N, K, "store");
    if (!store) return NULL;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_pack_check_padding(ki->id, PyArray_DATA(store), (size_t)N, (size_t)K, 0, 0, ORK_EINVAL, &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(store);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    Py_RETURN_NONE;
}

/* store_from_file(buffer, kind, N, K) -> the int8 tile store (pack.h shape) of a narrow file store
 * (int6 / int5; a new array); FormatError naming a code outside the kind's range. */
PyObject *orkpy_store_from_file(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *b_obj;
    const char *kind_s;
    Py_ssize_t N, K;
    if (!PyArg_ParseTuple(args, "Osnn:store_from_file", &b_obj, &kind_s, &N, &K)) return NULL;
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || check_nk(N, K) < 0) return NULL;
    if (ki->bits != 8 || ki->store_bits >= 8)
        return PyErr_Format(PyExc_ValueError, "kind %s has no narrow file store", ki->name);
    Py_buffer view;
    if (PyObject_GetBuffer(b_obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    const size_t nb = ork_pack_store_bytes(ki->id, (size_t)N, (size_t)K);
    const size_t fb = ork_pack_file_store_bytes(ki->id, (size_t)N, (size_t)K);
    if ((size_t)view.len != fb) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "a %s store of (%zd, %zd) is %zu bytes in a file, got %zd", ki->name, N, K,
                            fb, view.len);
    }
    size_t shape[4];
    ork_pack_store_shape(ki->id, (size_t)N, (size_t)K, shape);
    npy_intp dims[4] = {(npy_intp)shape[0], (npy_intp)shape[1], (npy_intp)shape[2], (npy_intp)shape[3]};
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(4, dims, NPY_INT8);
    if (!out) {
        PyBuffer_Release(&view);
        return NULL;
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_unpack_bits(ki->id, (const uint8_t *)view.buf, nb, (int8_t *)PyArray_DATA(out), &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (st != ORK_OK) {
        Py_DECREF(out);
        return orkpy_raise(st, &err);
    }
    return (PyObject *)out;
}

/* f16_from_f32(x) -> uint16 (n,): IEEE float16 bit patterns of float32 x (n,), nearest, ties to
 * even (half.h; overflow -> inf). f16_to_f32(h) -> float32 (n,): their exact values. The codec of
 * float16 group scales (O4N1/O8N1 version 3). */
PyObject *orkpy_f16_from_f32(PyObject *self, PyObject *arg) {
    (void)self;
    PyArrayObject *x = orkpy_as_exact(arg, NPY_FLOAT32, 1, "x");
    if (!x) return NULL;
    npy_intp n = PyArray_DIM(x, 0);
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_UINT16);
    if (out) {
        const float *src = (const float *)PyArray_DATA(x);
        uint16_t *dst = (uint16_t *)PyArray_DATA(out);
        for (npy_intp i = 0; i < n; i++) dst[i] = ork_f16_from_f32(src[i]);
    }
    Py_DECREF(x);
    return (PyObject *)out;
}

PyObject *orkpy_f16_to_f32(PyObject *self, PyObject *arg) {
    (void)self;
    PyArrayObject *h = orkpy_as_exact(arg, NPY_UINT16, 1, "h");
    if (!h) return NULL;
    npy_intp n = PyArray_DIM(h, 0);
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_FLOAT32);
    if (out) {
        const uint16_t *src = (const uint16_t *)PyArray_DATA(h);
        float *dst = (float *)PyArray_DATA(out);
        for (npy_intp i = 0; i < n; i++) dst[i] = ork_f16_to_f32(src[i]);
    }
    Py_DECREF(h);
    return (PyObject *)out;
}
