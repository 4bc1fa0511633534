/* module.c - orkpy._core: the CPython/NumPy binding of the C core.
 *
 * Every exported function has the same shape:
 *   1. parse arguments,
 *   2. coerce arrays at the boundary (dtype checked, then cast to the core's
 *      dtype, C-contiguous, aligned),
 *   3. allocate outputs,
 *   4. release the GIL and call the core,
 *   5. map the status through errors.c.
 * No numerics happen here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define PY_ARRAY_UNIQUE_SYMBOL orkpy_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <string.h>

#include "../ork/actspec.h"
#include "../ork/affine.h"
#include "../ork/cpu.h"
#include "../ork/ggml_types.h"
#include "../ork/pool.h"
#include "../ork/quant.h"
#include "../ork/gemm_f32.h" /* the kernel families whose tables capabilities() names */
#include "../ork/pack.h"
#include "../ork/i4.h"
#include "bindings.h"
#include "errors.h"

/* ---------------------------------------------------------- quantize -- */

PyDoc_STRVAR(quantize_doc,
             "quantize(w, kind, imatrix=None, sr=False, seed=0, clip_grid=None, threads=0, group=0, full_search=False)\n"
             "-> (codes, scales). Low level; use orkpy.quantize.");

/* the imatrix argument: float32 (K,), or NULL with a ValueError naming the mismatch */
static PyArrayObject *as_imatrix(PyObject *obj, npy_intp K) {
    PyArrayObject *im = orkpy_as_float32(obj, 1, "imatrix");
    if (im && PyArray_DIM(im, 0) != K) {
        PyErr_Format(PyExc_ValueError, "imatrix has %zd entries but w has K = %zd input columns",
                     (Py_ssize_t)PyArray_DIM(im, 0), (Py_ssize_t)K);
        Py_DECREF(im);
        return NULL;
    }
    return im;
}

static PyObject *py_quantize(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"w", "kind", "imatrix", "sr", "seed", "clip_grid", "threads", "group", "full_search", NULL};
    PyObject *w_obj, *im_obj = Py_None, *grid_obj = Py_None;
    const char *kind_s;
    int sr = 0, threads = 0, full_search = 0;
    unsigned long long seed = 0;
    Py_ssize_t group = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Os|OpKOinp:quantize", kwlist, &w_obj, &kind_s, &im_obj,
                                     &sr, &seed, &grid_obj, &threads, &group, &full_search))
        return NULL;
    if (group < 0) return PyErr_Format(PyExc_ValueError, "group size must be >= 0, got %zd", group);
    ork_quant_params p;
    memset(&p, 0, sizeof p);
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || orkpy_check_threads(threads) < 0) return NULL;
    p.kind = ki->id;

    PyArrayObject *w = NULL, *im = NULL, *grid = NULL, *codes = NULL, *scales = NULL;
    PyObject *result = NULL;
    /* a float16 weight is quantized as stored (ork_quantize_typed converts each row on the workers) */
    uint32_t w_type = ORK_GGML_F32;
    if (PyArray_Check(w_obj) && PyArray_TYPE((PyArrayObject *)w_obj) == NPY_HALF) {
        if (!(w = orkpy_as_exact(w_obj, NPY_HALF, 2, "w"))) goto done;
        w_type = ORK_GGML_F16;
    } else if (!(w = orkpy_as_float32(w_obj, 2, "w"))) {
        goto done;
    }
    npy_intp N = PyArray_DIM(w, 0), K = PyArray_DIM(w, 1);
    if (im_obj != Py_None) {
        if (!(im = as_imatrix(im_obj, K))) goto done;
        p.imatrix = (const float *)PyArray_DATA(im);
    }
    if (grid_obj != Py_None) {
        if (!(grid = orkpy_as_float32(grid_obj, 1, "clip_grid"))) goto done;
        p.grid = (const float *)PyArray_DATA(grid);
        p.ngrid = (size_t)PyArray_DIM(grid, 0);
        if (p.ngrid == 0) {
            PyErr_SetString(PyExc_ValueError, "clip_grid must not be empty");
            goto done;
        }
    }
    p.sr = sr;
    p.seed = (uint64_t)seed;
    p.nthreads = threads;
    p.group = group < K ? (size_t)group : 0; /* a group of K or more is one scale per row */
    p.full_search = full_search;

    npy_intp cdims[2] = {N, (npy_intp)ork_quant_row_bytes(p.kind, (size_t)K)};
    npy_intp sdims[2] = {N, (npy_intp)ork_group_count((size_t)K, p.group)};
    codes = (PyArrayObject *)PyArray_SimpleNew(2, cdims, orkpy_code_typenum(ki));
    scales = (PyArrayObject *)PyArray_SimpleNew(p.group ? 2 : 1, sdims, NPY_FLOAT32);
    if (!codes || !scales) goto done;

    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_quantize_typed(PyArray_DATA(w), w_type, (size_t)N, (size_t)K, &p, PyArray_DATA(codes),
                            (float *)PyArray_DATA(scales), &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = Py_BuildValue("(OO)", codes, scales);
done:
    Py_XDECREF(w);
    Py_XDECREF(im);
    Py_XDECREF(grid);
    Py_XDECREF(codes);
    Py_XDECREF(scales);
    return result;
}

PyDoc_STRVAR(quantize_affine_doc,
             "quantize_affine(w, kind, imatrix=None, threads=0, group=0) -> (codes, scales, offsets): affine groups "
             "(csrc/ork/affine.h). Low level; use orkpy.quantize(..., symmetric=False).");

static PyObject *py_quantize_affine(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"w", "kind", "imatrix", "threads", "group", NULL};
    PyObject *w_obj, *im_obj = Py_None;
    const char *kind_s;
    int threads = 0;
    Py_ssize_t group = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Os|Oin:quantize_affine", kwlist, &w_obj, &kind_s, &im_obj, &threads,
                                     &group))
        return NULL;
    if (group < 0) return PyErr_Format(PyExc_ValueError, "group size must be >= 0, got %zd", group);
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || orkpy_check_threads(threads) < 0) return NULL;
    ork_quant_params p;
    memset(&p, 0, sizeof p);
    p.kind = ki->id;
    p.nthreads = threads;
    p.group = (size_t)group;
    PyArrayObject *w = NULL, *im = NULL, *codes = NULL, *scales = NULL, *offsets = NULL;
    PyObject *result = NULL;
    if (!(w = orkpy_as_float32(w_obj, 2, "w"))) goto done;
    npy_intp N = PyArray_DIM(w, 0), K = PyArray_DIM(w, 1);
    if (im_obj != Py_None) {
        if (!(im = as_imatrix(im_obj, K))) goto done;
        p.imatrix = (const float *)PyArray_DATA(im);
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = N > 0 && K > 0 ? ork_affine_check(p.kind, (size_t)K, p.group, &err) : ORK_OK;
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    npy_intp cdims[2] = {N, K};
    npy_intp sdims[2] = {N, (npy_intp)ork_group_count((size_t)K, p.group)};
    codes = (PyArrayObject *)PyArray_SimpleNew(2, cdims, NPY_INT8);
    scales = (PyArrayObject *)PyArray_SimpleNew(2, sdims, NPY_FLOAT32);
    offsets = (PyArrayObject *)PyArray_SimpleNew(2, sdims, NPY_FLOAT32);
    if (!codes || !scales || !offsets) goto done;
    Py_BEGIN_ALLOW_THREADS
    st = ork_quantize_affine((const float *)PyArray_DATA(w), (size_t)N, (size_t)K, &p, (int8_t *)PyArray_DATA(codes),
                             (float *)PyArray_DATA(scales), (float *)PyArray_DATA(offsets), &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = Py_BuildValue("(OOO)", codes, scales, offsets);
done:
    Py_XDECREF(w);
    Py_XDECREF(im);
    Py_XDECREF(codes);
    Py_XDECREF(scales);
    Py_XDECREF(offsets);
    return result;
}

/* -------------------------------------------------------- dequantize -- */

PyDoc_STRVAR(dequantize_doc, "dequantize(codes, scales, kind, K, threads=0, group=0) -> float32 (N, K)");

static PyObject *py_dequantize(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"codes", "scales", "kind", "K", "threads", "group", NULL};
    PyObject *c_obj, *s_obj;
    const char *kind_s;
    Py_ssize_t K, group = 0;
    int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOsn|in:dequantize", kwlist, &c_obj, &s_obj, &kind_s, &K,
                                     &threads, &group))
        return NULL;
    if (group < 0) return PyErr_Format(PyExc_ValueError, "group size must be >= 0, got %zd", group);
    const ork_kind_info *ki = orkpy_parse_kind(kind_s);
    if (!ki || orkpy_check_threads(threads) < 0) return NULL;
    const ork_kind kind = ki->id;
    if (K <= 0) return PyErr_Format(PyExc_ValueError, "K must be positive, got %zd", K);
    PyArrayObject *codes = NULL, *scales = NULL, *out = NULL;
    PyObject *result = NULL;
    if (!(codes = orkpy_as_exact(c_obj, orkpy_code_typenum(ki), 2, "codes"))) goto done;
    const size_t gsz = group < K ? (size_t)group : 0, G = ork_group_count((size_t)K, gsz);
    if (!(scales = orkpy_as_exact(s_obj, NPY_FLOAT32, gsz ? 2 : 1, "scales"))) goto done;
    npy_intp N = PyArray_DIM(codes, 0);
    if (gsz && (size_t)PyArray_DIM(scales, 1) != G) {
        PyErr_Format(PyExc_ValueError, "scales have %zd groups per row, expected G = %zu for K = %zd and group %zd",
                     (Py_ssize_t)PyArray_DIM(scales, 1), G, K, group);
        goto done;
    }
    if (PyArray_DIM(codes, 1) != (npy_intp)ork_quant_row_bytes(kind, (size_t)K) ||
        PyArray_DIM(scales, 0) != N) {
        PyErr_Format(PyExc_ValueError,
                     "codes shape (%zd, %zd) and scales (%zd,) do not fit kind '%s' with K = %zd "
                     "(expected (N, %zu) and (N,))",
                     (Py_ssize_t)N, (Py_ssize_t)PyArray_DIM(codes, 1), (Py_ssize_t)PyArray_DIM(scales, 0),
                     kind_s, K, ork_quant_row_bytes(kind, (size_t)K));
        goto done;
    }
    npy_intp odims[2] = {N, (npy_intp)K};
    if (!(out = (PyArrayObject *)PyArray_SimpleNew(2, odims, NPY_FLOAT32))) goto done;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_dequantize(kind, PyArray_DATA(codes), (const float *)PyArray_DATA(scales), (size_t)N,
                        (size_t)K, gsz, (float *)PyArray_DATA(out), threads, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    result = (PyObject *)out;
    out = NULL;
done:
    Py_XDECREF(codes);
    Py_XDECREF(scales);
    Py_XDECREF(out);
    return result;
}

/* ------------------------------------------------------------ tables -- */

/* kinds() -> [dict(name, id, bits, nlev, levels, lut, zero_code)]: the kind
 * registry (quant.h), in id order. Exporting it seals the registry. */
static PyObject *py_kinds(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    ork_kind_seal();
    size_t n = ork_kind_count();
    PyObject *out = PyList_New(0);
    for (size_t i = 0; out && i < n; i++) {
        const ork_kind_info *k = ork_kind_get((ork_kind)i);
        if (!k) continue;
        PyArrayObject *lev = NULL, *lut = NULL;
        PyObject *row = NULL;
        if (k->bits == 4) {
            npy_intp nl = k->nlev, n16 = 16;
            lev = (PyArrayObject *)PyArray_SimpleNew(1, &nl, NPY_FLOAT32);
            lut = (PyArrayObject *)PyArray_SimpleNew(1, &n16, NPY_INT8);
            if (lev && lut) {
                memcpy(PyArray_DATA(lev), k->levels, (size_t)k->nlev * sizeof(float));
                memcpy(PyArray_DATA(lut), k->lut, 16);
            }
        }
        if (k->bits != 4 || (lev && lut))
            row = Py_BuildValue("{s:s,s:i,s:i,s:i,s:O,s:O,s:i,s:i,s:i,s:i}", "name", k->name, "id", (int)k->id, "bits", k->bits,
                                "nlev", k->nlev, "levels", lev ? (PyObject *)lev : Py_None, "lut",
                                lut ? (PyObject *)lut : Py_None, "zero_code", (int)k->zero_code, "qmax", k->qmax,
                                "store_bits", k->store_bits, "act_bits", k->act_bits);
        Py_XDECREF(lev);
        Py_XDECREF(lut);
        if (!row || PyList_Append(out, row) < 0) Py_CLEAR(out);
        Py_XDECREF(row);
    }
    return out;
}

/* _register_kind_for_tests(name, levels): TESTS ONLY (ork_kind_register):
 * append a 4-bit codebook to the registry before anything exported it. */
static PyObject *py_register_kind_for_tests(PyObject *self, PyObject *args) {
    (void)self;
    const char *name;
    PyObject *lev_obj;
    if (!PyArg_ParseTuple(args, "sO:_register_kind_for_tests", &name, &lev_obj)) return NULL;
    PyArrayObject *lev = orkpy_as_float32(lev_obj, 1, "levels");
    if (!lev) return NULL;
    ork_kind id = ORK_KIND_NF4;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_kind_register(name, (const float *)PyArray_DATA(lev), (int)PyArray_DIM(lev, 0), &id, &err);
    Py_DECREF(lev);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    return PyLong_FromLong((long)id);
}

/* act_modes() -> [dict(name, id, static, per_tensor, outliers, bits)]: the activation mode
 * registry (actspec.h), in id order; bits the tuple of widths the row serves (its mask). Exporting it
 * seals the registry. */
static PyObject *py_act_modes(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    ork_act_mode_seal();
    size_t n = ork_act_mode_count();
    PyObject *out = PyList_New(0);
    for (size_t i = 0; out && i < n; i++) {
        const ork_act_mode_info *r = ork_act_mode_get((int)i);
        if (!r) continue;
        PyObject *bits = PyList_New(0); /* the widths the row serves, ascending */
        for (int b = 1; bits && b <= 32; b++) {
            if (!ork_act_bits_ok(r, b)) continue;
            PyObject *v = PyLong_FromLong(b);
            if (!v || PyList_Append(bits, v) < 0) Py_CLEAR(bits);
            Py_XDECREF(v);
        }
        PyObject *bt = bits ? PyList_AsTuple(bits) : NULL;
        Py_XDECREF(bits);
        PyObject *row = bt ? Py_BuildValue("{s:s,s:i,s:O,s:O,s:O,s:N}", "name", r->name, "id", r->id, "static",
                                           (r->flags & ORK_ACTF_STATIC) ? Py_True : Py_False, "per_tensor",
                                           (r->flags & ORK_ACTF_PER_TENSOR) ? Py_True : Py_False, "outliers",
                                           (r->flags & ORK_ACTF_OUTLIERS) ? Py_True : Py_False, "bits", bt)
                           : NULL;
        if (!row || PyList_Append(out, row) < 0) Py_CLEAR(out);
        Py_XDECREF(row);
    }
    return out;
}

/* TESTS ONLY: the dummy mode's kernel: half the range its flags give (a static mode's clip,
 * a per-tensor mode's largest row absmax, else each row's absmax) */
static ork_status test_range_half(const ork_act_spec *spec, const float *x, size_t M, size_t K, float *r,
                                  ork_err *err) {
    (void)x, (void)K, (void)err;
    const ork_act_mode_info *row = ork_act_mode_get(spec->mode);
    float t = 0.0f;
    for (size_t m = 0; m < M; m++)
        if (r[m] > t) t = r[m];
    for (size_t m = 0; m < M; m++) {
        float a = (row->flags & ORK_ACTF_STATIC) ? spec->clip : (row->flags & ORK_ACTF_PER_TENSOR) ? t : r[m];
        r[m] = 0.5f * a;
    }
    return ORK_OK;
}

/* _register_act_mode_for_tests(name, static=False, per_tensor=False, outliers=False) -> id: TESTS ONLY
 * (ork_act_mode_register): a mode whose kernel is test_range_half, before anything exported the table. */
static PyObject *py_register_act_mode_for_tests(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"name", "static", "per_tensor", "outliers", NULL};
    const char *name;
    int st_f = 0, pt_f = 0, ou_f = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|ppp:_register_act_mode_for_tests", kwlist, &name, &st_f, &pt_f,
                                     &ou_f))
        return NULL;
    unsigned flags = (st_f ? ORK_ACTF_STATIC : 0u) | (pt_f ? ORK_ACTF_PER_TENSOR : 0u) | (ou_f ? ORK_ACTF_OUTLIERS : 0u);
    int id = 0;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_act_mode_register(name, flags, test_range_half, &id, &err);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    return PyLong_FromLong((long)id);
}

static PyObject *py_default_grid(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    npy_intp n = ORK_QUANT_DEFAULT_GRID_N;
    PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_FLOAT32);
    if (a) ork_quant_default_grid((float *)PyArray_DATA(a), (size_t)n);
    return (PyObject *)a;
}

/* ------------------------------------------------------ capabilities -- */

static PyObject *py_capabilities(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    unsigned f = ork_cpu_features();
    PyObject *avail = PyList_New(0);
    if (!avail) return NULL;
    for (int i = 0; i < ORK_ISA_COUNT; i++) {
        if (!ork_isa_available((ork_isa)i)) continue;
        PyObject *s = PyUnicode_FromString(ork_isa_name((ork_isa)i));
        if (!s || PyList_Append(avail, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(avail);
            return NULL;
        }
        Py_DECREF(s);
    }
    const char *arch =
#if defined(__x86_64__)
        "x86_64";
#elif defined(__aarch64__)
        "aarch64";
#else
        "other";
#endif
    return Py_BuildValue("{s:s,s:N,s:O,s:s,s:{s:O,s:O,s:O,s:O,s:O,s:O},s:i,s:s,s:s,s:s,s:s}", "isa",
                         ork_isa_name(ork_cpu_isa()), "available", avail, "forced_scalar",
                         ork_cpu_forced_scalar() ? Py_True : Py_False, "arch", arch, "cpu_features",
                         "avx2", (f & ORK_CPU_AVX2) ? Py_True : Py_False, "fma",
                         (f & ORK_CPU_FMA) ? Py_True : Py_False, "neon",
                         (f & ORK_CPU_NEON) ? Py_True : Py_False, "dotprod",
                         (f & ORK_CPU_DOTPROD) ? Py_True : Py_False, "avx512vnni",
                         (f & ORK_CPU_AVX512VNNI) ? Py_True : Py_False, "avx512",
                         (f & ORK_CPU_AVX512) ? Py_True : Py_False, "default_threads",
                         ork_pool_default_threads(), "quant_kernels",
                         ork_quant_kernels_active()->isa, "gemm_f32_kernels", ork_gemm_f32_kernels_active()->isa,
                         "matmul_kernels", ork_matmul_kernels_active()->isa, "i4_kernels", ork_i4_kernels_active()->isa);
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    (void)self;
    const char *s = PyUnicode_AsUTF8(arg);
    if (!s) return NULL;
    const char *prev = ork_isa_name(ork_cpu_isa());
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_cpu_set_isa(s, &err);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    return PyUnicode_FromString(prev);
}

/* ------------------------------------------------ ggml dequantization -- */

#include "../ork/dequant.h"
#include "../ork/ggml_types.h"

PyDoc_STRVAR(dequantize_raw_doc,
             "dequantize_raw(raw, type_id, n, threads=0, out=None) -> float32 (n,)\n"
             "Dequantize n elements of ggml type `type_id` from the uint8 1-D buffer `raw`,\n"
             "which must hold exactly n / block_size * type_size bytes. out: a writeable\n"
             "C-contiguous float32 array of n elements (any shape, not overlapping raw) to write\n"
             "into and return instead of a new array.");

PyDoc_STRVAR(dequantize_raw_checked_doc,
             "dequantize_raw_checked(raw, type_id, n, threads=0, out=None) -> (float32 (n,), int)\n"
             "dequantize_raw, and the index of the first NaN / Inf of the result (-1: all finite),\n"
             "found while each chunk's output is still in cache.");

static PyObject *dequantize_raw_impl(PyObject *args, PyObject *kw, int checked) {
    static char *kwlist[] = {"raw", "type_id", "n", "threads", "out", NULL};
    PyObject *raw_obj, *out_obj = Py_None;
    long long type_ll;
    Py_ssize_t n;
    int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, checked ? "OLn|iO:dequantize_raw_checked" : "OLn|iO:dequantize_raw",
                                     kwlist, &raw_obj, &type_ll, &n, &threads, &out_obj))
        return NULL;
    if (orkpy_check_threads(threads) < 0) return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "n must be >= 0, got %zd", n);
    if (type_ll < 0 || type_ll > 0xffffffffLL)
        return PyErr_Format(PyExc_ValueError, "invalid ggml type id %lld", type_ll);
    uint32_t type_id = (uint32_t)type_ll;
    ork_err err;
    err.msg[0] = '\0';
    /* a zero-length call validates the type: ORK_EINVAL for an invalid id,
     * ORK_ENOTIMPL (NotImplementedError) for a valid but unsupported one */
    ork_status st = ork_dequant_row(type_id, NULL, 0, NULL, &err);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    const ork_ggml_type_info *ti = ork_ggml_type(type_id);
    if ((size_t)n % ti->block_size != 0)
        return PyErr_Format(PyExc_ValueError, "%s: n = %zd is not a multiple of the block size %u",
                            ti->name, n, (unsigned)ti->block_size);
    size_t nblocks = (size_t)n / ti->block_size;
    if (nblocks > (size_t)PY_SSIZE_T_MAX / ti->type_size)
        return PyErr_Format(PyExc_ValueError, "%s: n = %zd is too large", ti->name, n);
    size_t want = nblocks * ti->type_size;

    PyArrayObject *raw = NULL, *out = NULL;
    PyObject *result = NULL;
    if (!(raw = orkpy_as_exact(raw_obj, NPY_UINT8, 1, "raw"))) goto done;
    if ((size_t)PyArray_DIM(raw, 0) != want) {
        PyErr_Format(PyExc_ValueError,
                     "raw has %zd bytes but %zd elements of %s need %zu (%zu blocks of %u bytes, "
                     "block size %u)",
                     (Py_ssize_t)PyArray_DIM(raw, 0), n, ti->name, want, nblocks,
                     (unsigned)ti->type_size, (unsigned)ti->block_size);
        goto done;
    }
    npy_intp odim = (npy_intp)n;
    if (out_obj == Py_None) {
        if (!(out = (PyArrayObject *)PyArray_SimpleNew(1, &odim, NPY_FLOAT32))) goto done;
    } else if (!PyArray_Check(out_obj) || PyArray_TYPE((PyArrayObject *)out_obj) != NPY_FLOAT32 ||
               !PyArray_ISCARRAY((PyArrayObject *)out_obj) || !PyArray_ISNOTSWAPPED((PyArrayObject *)out_obj)) {
        PyErr_SetString(PyExc_TypeError, "out must be a writeable, aligned, C-contiguous native float32 ndarray");
        goto done;
    } else if (PyArray_SIZE((PyArrayObject *)out_obj) != odim) {
        PyErr_Format(PyExc_ValueError, "out has %zd elements, n = %zd", (Py_ssize_t)PyArray_SIZE((PyArrayObject *)out_obj), n);
        goto done;
    } else {
        const char *o = (const char *)PyArray_DATA((PyArrayObject *)out_obj), *r = (const char *)PyArray_DATA(raw);
        if (n > 0 && want > 0 && o < r + want && r < o + (size_t)n * sizeof(float)) {
            PyErr_SetString(PyExc_ValueError, "out overlaps raw");
            goto done;
        }
        Py_INCREF(out_obj);
        out = (PyArrayObject *)out_obj;
    }
    size_t bad = (size_t)n;
    Py_BEGIN_ALLOW_THREADS
    st = ork_dequant_tensor_checked(type_id, PyArray_DATA(raw), (size_t)n, (float *)PyArray_DATA(out), threads,
                                    checked ? &bad : NULL, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        goto done;
    }
    if (checked) {
        result = Py_BuildValue("(On)", (PyObject *)out, bad == (size_t)n ? (Py_ssize_t)-1 : (Py_ssize_t)bad);
        goto done;
    }
    result = (PyObject *)out;
    out = NULL;
done:
    Py_XDECREF(raw);
    Py_XDECREF(out);
    return result;
}

static PyObject *py_dequantize_raw(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return dequantize_raw_impl(args, kw, 0);
}

static PyObject *py_dequantize_raw_checked(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return dequantize_raw_impl(args, kw, 1);
}

static PyObject *py_ggml_type_info(PyObject *self, PyObject *arg) {
    (void)self;
    long long t = PyLong_AsLongLong(arg);
    if (t == -1 && PyErr_Occurred()) return NULL;
    const ork_ggml_type_info *ti = (t >= 0 && t <= 0xffffffffLL) ? ork_ggml_type((uint32_t)t) : NULL;
    if (!ti) Py_RETURN_NONE;
    return Py_BuildValue("{s:s,s:I,s:I,s:d,s:O}", "name", ti->name, "block_size",
                         (unsigned)ti->block_size, "type_size", (unsigned)ti->type_size,
                         "bits_per_weight", ork_ggml_bits_per_weight((uint32_t)t), "quantized",
                         ti->is_quantized ? Py_True : Py_False);
}

static PyObject *py_ggml_type_count(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLong(ORK_GGML_TYPE_COUNT);
}

static PyMethodDef core_methods[] = {
    {"dequantize_raw", (PyCFunction)(void (*)(void))py_dequantize_raw, METH_VARARGS | METH_KEYWORDS,
     dequantize_raw_doc},
    {"dequantize_raw_checked", (PyCFunction)(void (*)(void))py_dequantize_raw_checked, METH_VARARGS | METH_KEYWORDS,
     dequantize_raw_checked_doc},
    {"ggml_type_info", py_ggml_type_info, METH_O,
     "ggml_type_info(type_id) -> None or dict(name, block_size, type_size, bits_per_weight, quantized)"},
    {"ggml_type_count", py_ggml_type_count, METH_NOARGS, "number of ggml type ids (valid ids are < this)"},
    {"quantize", (PyCFunction)(void (*)(void))py_quantize, METH_VARARGS | METH_KEYWORDS, quantize_doc},
    {"quantize_affine", (PyCFunction)(void (*)(void))py_quantize_affine, METH_VARARGS | METH_KEYWORDS,
     quantize_affine_doc},
    {"dequantize", (PyCFunction)(void (*)(void))py_dequantize, METH_VARARGS | METH_KEYWORDS,
     dequantize_doc},
    {"kinds", py_kinds, METH_NOARGS,
     "kinds() -> [dict(name, id, bits, nlev, levels, lut, zero_code)]: the quantization kind registry"},
    {"_register_kind_for_tests", py_register_kind_for_tests, METH_VARARGS,
     "_register_kind_for_tests(name, levels) -> id: TESTS ONLY, a 4-bit codebook row before kinds() is called"},
    {"act_modes", py_act_modes, METH_NOARGS,
     "act_modes() -> [dict(name, id, static, per_tensor, outliers, bits)]: the activation mode registry"},
    {"_register_act_mode_for_tests", (PyCFunction)(void (*)(void))py_register_act_mode_for_tests,
     METH_VARARGS | METH_KEYWORDS,
     "_register_act_mode_for_tests(name, static=False, per_tensor=False, outliers=False) -> id: TESTS ONLY, a mode "
     "(kernel: half the range its flags give) before act_modes() is called"},
    {"default_grid", py_default_grid, METH_NOARGS, "default clip-ratio grid"},
    {"capabilities", py_capabilities, METH_NOARGS, "CPU features and kernels in use"},
    {"set_isa", py_set_isa, METH_O, "set_isa(name) -> previous ISA name"},
    {"gguf_parse", orkpy_gguf_parse, METH_O, "gguf_parse(buffer) -> dict; validates the whole file"},
    {"find_nonfinite", (PyCFunction)(void (*)(void))orkpy_find_nonfinite, METH_VARARGS | METH_KEYWORDS,
     "find_nonfinite(a, threads=0) -> flat index of the first NaN / Inf of a float32 or float16 array, or -1 "
     "(the GIL released; threads <= 0: all cores)"},
    {"pack", (PyCFunction)(void (*)(void))orkpy_pack, METH_VARARGS | METH_KEYWORDS, "pack(codes, kind, N, K) -> store"},
    {"unpack", (PyCFunction)(void (*)(void))orkpy_unpack, METH_VARARGS | METH_KEYWORDS, "unpack(store, kind, N, K) -> codes"},
    {"matmul_int", (PyCFunction)(void (*)(void))orkpy_matmul_int, METH_VARARGS | METH_KEYWORDS,
     "matmul_int(store, kind, N, K, xq, threads=0) -> int32 (M, N)"},
    {"matmul", (PyCFunction)(void (*)(void))orkpy_matmul, METH_VARARGS | METH_KEYWORDS,
     "matmul(store, kind, N, K, bscale, x, act=None, threads=0, group=0, boffset=None) -> float32 (M, N); act: an "
     "activation spec dict (ActSpec.to_core()), None = per token; boffset: affine groups' offsets (N, G)"},
    {"i4_layout", orkpy_i4_layout, METH_O,
     "i4_layout(K) -> dict(Kp, row_bytes, kchunk, n_chunks, max_k): the int4 x int4 storage and chunking (i4.h)"},
    {"i4_pack", orkpy_i4_pack, METH_O, "i4_pack(codes int8 (rows, K) in [-8, 7]) -> uint8 (rows, Kp/2): the NPU's int4 rows"},
    {"i4_unpack", orkpy_i4_unpack, METH_VARARGS, "i4_unpack(packed uint8 (rows, Kp/2), K) -> int8 codes (rows, K)"},
    {"mm_i4", (PyCFunction)(void (*)(void))orkpy_mm_i4, METH_VARARGS | METH_KEYWORDS,
     "mm_i4(a, w, K, threads=0) -> int32 (M, N): the int4 x int4 product of packed rows, int16 chunks of 480 k"},
    {"mm_i4_partials", (PyCFunction)(void (*)(void))orkpy_mm_i4_partials, METH_VARARGS | METH_KEYWORDS,
     "mm_i4_partials(a, w, K) -> int16 (n_chunks, M, N): the scalar _ref's int16 sum of each chunk"},
    {"packed_header", (PyCFunction)(void (*)(void))orkpy_packed_header, METH_VARARGS | METH_KEYWORDS,
     "packed_header(kind, N, K) -> 64-byte O4N1/O8N1 header"},
    {"packed_parse", orkpy_packed_parse, METH_O, "packed_parse(buffer) -> dict; validates an O4N1/O8N1 file"},
    {"packed_check", (PyCFunction)(void (*)(void))orkpy_packed_check, METH_VARARGS | METH_KEYWORDS,
     "packed_check(store, kind, N, K, bscale): ValueError/TypeError unless a valid PackedWeight (codes, scales)"},
    {"store_to_file", orkpy_store_to_file, METH_VARARGS,
     "store_to_file(store, kind, N, K) -> bytes: the tile store as an O8N1/O4N1 file holds it"},
    {"store_from_file", orkpy_store_from_file, METH_VARARGS,
     "store_from_file(buffer, kind, N, K) -> int8 tile store of a narrow (int6 / int5) file store"},
    {"store_padding_check", orkpy_store_padding_check, METH_VARARGS,
     "store_padding_check(store, kind, N, K): ValueError naming a padding lane that is not the zero code"},
    {"packed_layout", (PyCFunction)(void (*)(void))orkpy_packed_layout, METH_VARARGS | METH_KEYWORDS,
     "packed_layout(kind, N, K) -> dict: store shape, dtype and bytes; O4N1/O8N1 magic and offsets"},
    {"f16_from_f32", orkpy_f16_from_f32, METH_O,
     "f16_from_f32(x float32 (n,)) -> uint16 (n,): float16 bits, nearest, ties to even (csrc/ork/half.h)"},
    {"f16_to_f32", orkpy_f16_to_f32, METH_O, "f16_to_f32(h uint16 (n,)) -> float32 (n,): the float16 values, exactly"},
    {"gptq", (PyCFunction)(void (*)(void))orkpy_gptq, METH_VARARGS | METH_KEYWORDS,
     "gptq(w, gram, kind, damp=0.01, block=128, rows=0, group=0, static_groups=False, threads=0, "
     "overwrite_gram=False, precision='float64', affine=False) -> (codes, scales), or (codes, scales, offsets) with "
     "affine (csrc/ork/affine.h)"},
    {"hadamard_rows", orkpy_hadamard_rows, METH_VARARGS,
     "hadamard_rows(x, hp, scale, threads=0) -> None: x <- scale * x @ kron(hp, H_m) in place (float64 rows)"},
    {"gptq_factor", (PyCFunction)(void (*)(void))orkpy_gptq_factor, METH_VARARGS | METH_KEYWORDS,
     "gptq_factor(h, threads=0) -> float64 U (upper, inv(h) = U^T U)"},
    {"mapguard_state", orkpy_mapguard_state, METH_NOARGS,
     "mapguard_state() -> dict(installed, mappings): the SIGBUS guard of MappedFile"},
    {"nll_rows", orkpy_nll_rows, METH_VARARGS, "nll_rows(logits, targets, threads=0) -> float64 NLL per row (llama-perplexity); threads <= 0: all cores"},
    {"npu_matmul_task", (PyCFunction)(void (*)(void))orkpy_npu_matmul_task, METH_VARARGS | METH_KEYWORDS,
     "npu_matmul_task(dtype, M, K, N, in_addr, w_addr, out_addr) -> uint64[108] register commands (int8, fp16, int4)"},
    {"npu_names", orkpy_npu_names, METH_VARARGS, "npu_names(target, reg) -> (block name, register name)"},
    {"npu_int4_facts", orkpy_npu_int4_facts, METH_NOARGS,
     "npu_int4_facts() -> [dict]: the int4 task's register values no public source gives, and their basis"},
    {"npu_plan", (PyCFunction)(void (*)(void))orkpy_npu_plan, METH_VARARGS | METH_KEYWORDS,
     "npu_plan(M, K, N, max_m=0, max_k=0, max_n=0, precision='int8') -> dict: the task split and buffer sizes"},
    {"npu_plan_emit", (PyCFunction)(void (*)(void))orkpy_npu_plan_emit, METH_VARARGS | METH_KEYWORDS,
     "npu_plan_emit(M, K, N, cmd_addr, in_addr, w_addr, out_addr, ...) -> uint64 chained command buffer"},
    {"npu_chain_plan", (PyCFunction)(void (*)(void))orkpy_npu_chain_plan, METH_VARARGS | METH_KEYWORDS,
     "npu_chain_plan(shapes, max_m=0, max_k=0, max_n=0, precision='int8') -> dict: a chained job's tasks, buffers and regions"},
    {"npu_chain_emit", (PyCFunction)(void (*)(void))orkpy_npu_chain_emit, METH_VARARGS | METH_KEYWORDS,
     "npu_chain_emit(shapes, cmd_addr, in_addr, w_addrs, out_addr, ...) -> uint64 commands of a chained job"},
    {"npu_layout", (PyCFunction)(void (*)(void))orkpy_npu_layout, METH_VARARGS | METH_KEYWORDS,
     "npu_layout(op, M, K, N, array, ...) -> packed buffer or unpacked matrix"},
    {"npu_emulate", (PyCFunction)(void (*)(void))orkpy_npu_emulate, METH_VARARGS | METH_KEYWORDS,
     "npu_emulate(buffers, first_addr, amount, task_number) -> stats; runs the strict emulator"},
    {"npu_probe", orkpy_npu_probe, METH_O, "npu_probe(backend) -> None if usable here, else the reason"},
    {"_npu_install_fake_kernel_for_tests", orkpy_npu_install_fake_kernel_for_tests, METH_O,
     "test machinery: _npu_install_fake_kernel_for_tests(address of the fake kernel library's table, 0 = none)"},
    {"npu_backends", orkpy_npu_backends, METH_NOARGS, "npu_backends() -> tuple of the NPU backend names"},
    {"npu_pc_amount", orkpy_npu_pc_amount, METH_O, "npu_pc_amount(body_qwords) -> PC_REGISTER_AMOUNTS of a task body"},
    {"ffn_lut", orkpy_ffn_lut, METH_VARARGS,
     "ffn_lut(step, act=0) -> (int16[1024], scale): the chain's LUT of activation act (0 SiLU, 1 GELU-tanh)"},
    {"ffn_hist_edges", orkpy_ffn_hist_edges, METH_NOARGS, "lower edges of the |silu| histogram bins (+ top)"},
    {"range_mse", orkpy_range_mse, METH_VARARGS,
     "range_mse(count, sum, sum2, clips, qmax, threads=0) -> float64 squared error of each static range"},
    {"act_stats_rows", (PyCFunction)(void (*)(void))orkpy_act_stats_rows, METH_VARARGS | METH_KEYWORDS,
     "act_stats_rows(x, calls, prefix=0, divisor=None) -> the activation statistics of x's rows (float32 (M, K)) "
     "as a float linear's hook counts them, calls of these row counts, each value divided by divisor (K,)"},
    {"act_stats_edges", orkpy_act_stats_edges, METH_NOARGS,
     "lower edges of the activation statistics' |x| histogram bins (+ inf)"},
    {"ffn_modes", orkpy_ffn_modes, METH_NOARGS, "ffn_modes() -> tuple of the FFN chain's mode names"},
    {"linear_names", orkpy_linear_names, METH_O,
     "linear_names(hparams) -> the forward model's linear tensor names in its order (imatrix, set_npu)"},
    {"layer_linears", orkpy_layer_linears, METH_NOARGS, "layer_linears() -> a layer's linear keys, in order"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "orkpy._core", "orkpy's C core (binding layer).", -1, core_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__core(void) {
    import_array();
    PyObject *m = PyModule_Create(&core_module);
    if (!m) return NULL;
    if (orkpy_errors_init(m) < 0 || orkpy_model_init(m) < 0 || orkpy_npu_init(m) < 0 ||
        orkpy_map_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
