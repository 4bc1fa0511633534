/* py_collect.c - the statistics collections of orkpy._core.ForwardModel: imatrix sums, input Gram
 * matrices, activation statistics and FFN statistics. Their buffers, hooks and lifecycle live in the
 * core's runtime (csrc/ork/runtime.h); here the arguments are coerced, the core is called without the
 * GIL and what a take hands over is copied into NumPy arrays. */
#include "numpy_api.h"

#include <math.h>
#include <string.h>

#include "bindings.h"
#include "errors.h"
#include "py_model.h"
#include "../ork/act_range.h"

/* run a runtime call (which names `err`) without the GIL; return None, or NULL with its status raised */
#define RT_CALL(call)                                 \
    do {                                              \
        ork_err err;                                  \
        err.msg[0] = '\0';                            \
        ork_status st;                                \
        Py_BEGIN_ALLOW_THREADS                        \
        st = (call);                                  \
        Py_END_ALLOW_THREADS                          \
        if (st != ORK_OK) return orkpy_raise(st, &err); \
        Py_RETURN_NONE;                               \
    } while (0)

/* imatrix_enable(): start accumulating sum x^2 per input channel of every linear */
PyObject *orkpy_fwd_imatrix_enable(FwdObject *self, PyObject *unused) {
    (void)unused;
    if (orkpy_fwd_ready(self) < 0) return NULL;
    RT_CALL(ork_runtime_imatrix_enable(self->rt, &err));
}

/* imatrix_take() -> list of (sums float64 (K,), count) in linear_names order; stops accumulating */
PyObject *orkpy_fwd_imatrix_take(FwdObject *self, PyObject *unused) {
    (void)unused;
    if (orkpy_fwd_ready(self) < 0) return NULL;
    ork_rt_imatrix t;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_runtime_imatrix_take(self->rt, &t, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) return orkpy_raise(st, &err);
    PyObject *out = PyList_New((Py_ssize_t)t.n);
    for (size_t i = 0, off = 0; out && i < t.n; i++) {
        npy_intp K = (npy_intp)ork_runtime_linear(self->rt, i)->K;
        PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(1, &K, NPY_FLOAT64);
        if (a) memcpy(PyArray_DATA(a), t.sums + off, (size_t)K * sizeof(double));
        off += (size_t)K;
        PyObject *item = a ? Py_BuildValue("(NK)", a, (unsigned long long)t.count[i]) : NULL;
        if (!item) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    ork_rt_imatrix_free(&t);
    return out;
}

/* a sequence of ints as a PyMem_Malloc'ed int64 array (*n entries), or NULL with an exception set */
static int64_t *index_list(PyObject *seq, const char *what, Py_ssize_t *n) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast) return NULL;
    *n = PySequence_Fast_GET_SIZE(fast);
    int64_t *idx = (int64_t *)PyMem_Malloc((size_t)(*n ? *n : 1) * sizeof *idx);
    if (!idx) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < *n; k++) {
        Py_ssize_t i = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(fast, k), PyExc_OverflowError);
        if (i == -1 && PyErr_Occurred()) {
            PyMem_Free(idx);
            Py_DECREF(fast);
            return NULL;
        }
        idx[k] = (int64_t)i;
    }
    Py_DECREF(fast);
    return idx;
}

/* gram_enable(indices): start accumulating the input Gram matrix (linear.h) of the linears at these
 * positions of linear_names; replaces a collection in progress */
PyObject *orkpy_fwd_gram_enable(FwdObject *self, PyObject *args) {
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "O", &seq) || orkpy_fwd_ready(self) < 0) return NULL;
    Py_ssize_t n = 0;
    int64_t *idx = index_list(seq, "gram_enable expects a sequence of linear indices", &n);
    if (!idx) return NULL;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_runtime_gram_enable(self->rt, idx, (size_t)n, &err);
    Py_END_ALLOW_THREADS
    PyMem_Free(idx);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    Py_RETURN_NONE;
}

static void gram_capsule_free(PyObject *cap) { free(PyCapsule_GetPointer(cap, "orkpy.gram")); }

/* gram_take() -> {index: (G float64 (K, K) symmetric, rows)}; stops accumulating */
PyObject *orkpy_fwd_gram_take(FwdObject *self, PyObject *unused) {
    (void)unused;
    if (orkpy_fwd_ready(self) < 0) return NULL;
    ork_rt_grams t;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_runtime_gram_take(self->rt, &t, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) return orkpy_raise(st, &err);
    PyObject *out = PyDict_New();
    for (size_t i = 0; out && i < t.n; i++) {
        if (!t.upper[i]) continue;
        const size_t K = ork_runtime_linear(self->rt, i)->K;
        npy_intp dims[2] = {(npy_intp)K, (npy_intp)K};
        /* no copy: the buffer is mirrored in place and the array owns it (a capsule frees it), so
         * the hand-over never holds a matrix twice (an 8B model's ffn_down: 1.2 GB) */
        ork_rt_gram_symmetric(t.upper[i], K, t.upper[i]);
        PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNewFromData(2, dims, NPY_FLOAT64, t.upper[i]);
        PyObject *cap = a ? PyCapsule_New(t.upper[i], "orkpy.gram", gram_capsule_free) : NULL;
        if (cap && PyArray_SetBaseObject(a, cap) == 0) {
            t.upper[i] = NULL; /* the array's now */
        } else {
            if (cap) { /* SetBaseObject failed and stole cap: it frees the buffer with the capsule */
                t.upper[i] = NULL;
            }
            Py_CLEAR(a);
        }
        PyObject *item = a ? Py_BuildValue("(NK)", a, (unsigned long long)t.rows[i]) : NULL;
        PyObject *key = item ? PyLong_FromSize_t(i) : NULL;
        int r = key ? PyDict_SetItem(out, key, item) : -1;
        Py_XDECREF(key);
        Py_XDECREF(item);
        if (r < 0) Py_CLEAR(out);
    }
    ork_rt_grams_free(&t);
    return out;
}

/* act_stats_enable(prefix=0): start collecting activation statistics of every linear's input (linear.h),
 * the first `prefix` rows of each block linear's calls left out (positions 0..prefix-1; not the head's) */
PyObject *orkpy_fwd_act_stats_enable(FwdObject *self, PyObject *args) {
    Py_ssize_t prefix = 0;
    if (!PyArg_ParseTuple(args, "|n:act_stats_enable", &prefix)) return NULL;
    if (prefix < 0) return PyErr_Format(PyExc_ValueError, "prefix must be >= 0, got %zd", prefix);
    if (orkpy_fwd_ready(self) < 0) return NULL;
    RT_CALL(ork_runtime_act_stats_enable(self->rt, (size_t)prefix, &err));
}

/* the dict of one linear's statistics (act_stats_take's items) */
static PyObject *stats_dict(const ork_act_stats *s, size_t K_) {
    npy_intp K = (npy_intp)K_, B = ORK_ASTATS_BINS;
    PyArrayObject *ch = (PyArrayObject *)PyArray_SimpleNew(1, &K, NPY_FLOAT32);
    PyArrayObject *c = (PyArrayObject *)PyArray_SimpleNew(1, &B, NPY_UINT64);
    PyArrayObject *s1 = (PyArrayObject *)PyArray_SimpleNew(1, &B, NPY_FLOAT64);
    PyArrayObject *s2 = (PyArrayObject *)PyArray_SimpleNew(1, &B, NPY_FLOAT64);
    if (!ch || !c || !s1 || !s2) {
        Py_XDECREF(ch);
        Py_XDECREF(c);
        Py_XDECREF(s1);
        Py_XDECREF(s2);
        return NULL;
    }
    if (K) memcpy(PyArray_DATA(ch), s->ch_absmax, (size_t)K * sizeof(float));
    memcpy(PyArray_DATA(c), s->count, sizeof s->count);
    memcpy(PyArray_DATA(s1), s->sum, sizeof s->sum);
    memcpy(PyArray_DATA(s2), s->sum2, sizeof s->sum2);
    /* "N" steals the arrays even on failure */
    return Py_BuildValue("{s:K,s:K,s:d,s:N,s:N,s:N,s:N}", "rows", (unsigned long long)s->rows, "n_clipped",
                         (unsigned long long)s->n_clipped, "absmax", (double)s->absmax, "ch_absmax", ch, "count", c,
                         "sum", s1, "sum2", s2);
}

/* act_stats_take() -> list per linear (linear_names order) of dict(rows, n_clipped, absmax, ch_absmax float32 (K,),
 * count uint64 (B,), sum, sum2 float64 (B,)); stops collecting */
PyObject *orkpy_fwd_act_stats_take(FwdObject *self, PyObject *unused) {
    (void)unused;
    if (orkpy_fwd_ready(self) < 0) return NULL;
    ork_rt_act_stats t;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_runtime_act_stats_take(self->rt, &t, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) return orkpy_raise(st, &err);
    PyObject *out = PyList_New((Py_ssize_t)t.n);
    for (size_t i = 0; out && i < t.n; i++) {
        PyObject *item = stats_dict(&t.st[i], ork_runtime_linear(self->rt, i)->K);
        if (!item) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    ork_rt_act_stats_free(&t);
    return out;
}

/* act_stats_edges() -> float64 (B + 1,): the lower edge of every histogram bin, then +inf */
PyObject *orkpy_act_stats_edges(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    npy_intp n = ORK_ASTATS_BINS + 1;
    PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_FLOAT64);
    if (!a) return NULL;
    double *e = (double *)PyArray_DATA(a);
    for (int i = 0; i < ORK_ASTATS_BINS; i++) e[i] = ork_act_stats_edge(i);
    e[ORK_ASTATS_BINS] = INFINITY;
    return (PyObject *)a;
}

/* range_mse(count, sum, sum2, clips, qmax, threads=0) -> float64 (len(clips),): the squared error of each static
 * range on an |x| histogram of act_stats_edges()'s bins (act_range.h) */
PyObject *orkpy_range_mse(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[4];
    int qmax, threads = 0;
    if (!PyArg_ParseTuple(args, "OOOOi|i:range_mse", &o[0], &o[1], &o[2], &o[3], &qmax, &threads) ||
        orkpy_check_threads(threads) < 0)
        return NULL;
    static const char *const names[4] = {"count", "sum", "sum2", "clips"};
    PyArrayObject *a[4] = {NULL, NULL, NULL, NULL};
    PyObject *res = NULL;
    for (int i = 0; i < 4; i++)
        if (!(a[i] = orkpy_as_exact(o[i], NPY_FLOAT64, 1, names[i]))) goto done;
    for (int i = 0; i < 3; i++)
        if (PyArray_DIM(a[i], 0) != ORK_ASTATS_BINS) {
            PyErr_Format(PyExc_ValueError, "%s must have %d values (the histogram's bins), got %zd", names[i],
                         ORK_ASTATS_BINS, (Py_ssize_t)PyArray_DIM(a[i], 0));
            goto done;
        }
    double edges[ORK_ASTATS_BINS + 1];
    for (int i = 0; i < ORK_ASTATS_BINS; i++) edges[i] = ork_act_stats_edge(i);
    edges[ORK_ASTATS_BINS] = INFINITY;
    npy_intp n = PyArray_DIM(a[3], 0);
    res = PyArray_SimpleNew(1, &n, NPY_FLOAT64);
    if (!res) goto done;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_act_range_mse((const double *)PyArray_DATA(a[0]), (const double *)PyArray_DATA(a[1]),
                           (const double *)PyArray_DATA(a[2]), edges, ORK_ASTATS_BINS,
                           (const double *)PyArray_DATA(a[3]), (size_t)n, qmax,
                           (double *)PyArray_DATA((PyArrayObject *)res), threads, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        Py_CLEAR(res);
        orkpy_raise(st, &err);
    }
done:
    for (int i = 0; i < 4; i++) Py_XDECREF(a[i]);
    return res;
}

PyObject *orkpy_fwd_ffn_stats_enable(FwdObject *self, PyObject *unused) {
    (void)unused;
    if (orkpy_fwd_ready(self) < 0) return NULL;
    RT_CALL(ork_runtime_ffn_stats_enable(self->rt, &err));
}

/* -> list per layer of dict(gmax, smin, smax, umax, pmax, n, s_absmax_ch, hist); stops collecting */
PyObject *orkpy_fwd_ffn_stats_take(FwdObject *self, PyObject *unused) {
    (void)unused;
    if (orkpy_fwd_ready(self) < 0) return NULL;
    ork_rt_ffn_stats t;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_runtime_ffn_stats_take(self->rt, &t, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) return orkpy_raise(st, &err);
    PyObject *out = PyList_New((Py_ssize_t)t.n);
    for (size_t i = 0; out && i < t.n; i++) {
        const ork_ffn_stats *s = &t.st[i];
        npy_intp nf = (npy_intp)self->m->n_ff, nh = ORK_FFN_HIST;
        PyArrayObject *ch = (PyArrayObject *)PyArray_SimpleNew(1, &nf, NPY_FLOAT32);
        PyArrayObject *hist = (PyArrayObject *)PyArray_SimpleNew(1, &nh, NPY_UINT64);
        if (!ch || !hist) {
            Py_XDECREF(ch);
            Py_XDECREF(hist);
            Py_CLEAR(out);
            break;
        }
        memcpy(PyArray_DATA(ch), s->s_absmax_ch, (size_t)nf * sizeof(float));
        memcpy(PyArray_DATA(hist), s->hist, sizeof s->hist);
        PyObject *item = Py_BuildValue("{s:d,s:d,s:d,s:d,s:d,s:K,s:N,s:N}", "gmax", (double)s->gmax, "smin",
                                       (double)s->smin, "smax", (double)s->smax, "umax", (double)s->umax, "pmax",
                                       (double)s->pmax, "n", (unsigned long long)s->n, "s_absmax_ch", ch, "hist", hist);
        if (!item) { /* "N" steals ch and hist even on failure */
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    ork_rt_ffn_stats_free(&t);
    return out;
}

/* ffn_hist_edges() -> float64 (H + 1,): the FFN statistics' histogram edges, the first 0 */
PyObject *orkpy_ffn_hist_edges(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    npy_intp n = ORK_FFN_HIST + 1;
    PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_FLOAT64);
    if (!a) return NULL;
    double *e = (double *)PyArray_DATA(a);
    for (int i = 0; i <= ORK_FFN_HIST; i++) e[i] = ork_ffn_hist_edge(i);
    e[0] = 0.0;
    return (PyObject *)a;
}

/* capture_enable(indices, rows): start capturing the input rows (linear.h) of the linears at these positions
 * of linear_names, room for `rows` rows each; replaces a capture in progress */
PyObject *orkpy_fwd_capture_enable(FwdObject *self, PyObject *args) {
    PyObject *seq;
    Py_ssize_t rows;
    if (!PyArg_ParseTuple(args, "On:capture_enable", &seq, &rows) || orkpy_fwd_ready(self) < 0) return NULL;
    if (rows < 0) return PyErr_Format(PyExc_ValueError, "rows must be >= 0, got %zd", rows);
    Py_ssize_t n = 0;
    int64_t *idx = index_list(seq, "capture_enable expects a sequence of linear indices", &n);
    if (!idx) return NULL;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_runtime_capture_enable(self->rt, idx, (size_t)n, (size_t)rows, &err);
    Py_END_ALLOW_THREADS
    PyMem_Free(idx);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    Py_RETURN_NONE;
}

static void capture_capsule_free(PyObject *cap) { free(PyCapsule_GetPointer(cap, "orkpy.capture")); }

/* capture_take() -> {index: float32 (rows, K) of the captured inputs}; stops capturing. No copy: each array
 * owns its buffer (a capsule frees it) */
PyObject *orkpy_fwd_capture_take(FwdObject *self, PyObject *unused) {
    (void)unused;
    if (orkpy_fwd_ready(self) < 0) return NULL;
    ork_rt_capture t;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_runtime_capture_take(self->rt, &t, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) return orkpy_raise(st, &err);
    PyObject *out = PyDict_New();
    for (size_t i = 0; out && i < t.n; i++) {
        if (!t.x[i]) continue;
        npy_intp dims[2] = {(npy_intp)t.used[i], (npy_intp)ork_runtime_linear(self->rt, i)->K};
        PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNewFromData(2, dims, NPY_FLOAT32, t.x[i]);
        PyObject *cap = a ? PyCapsule_New(t.x[i], "orkpy.capture", capture_capsule_free) : NULL;
        if (cap && PyArray_SetBaseObject(a, cap) == 0) {
            t.x[i] = NULL; /* the array's now */
        } else {
            if (cap) t.x[i] = NULL; /* SetBaseObject stole cap: the capsule frees the buffer */
            Py_CLEAR(a);
        }
        PyObject *key = a ? PyLong_FromSize_t(i) : NULL;
        int r = key ? PyDict_SetItem(out, key, (PyObject *)a) : -1;
        Py_XDECREF(key);
        Py_XDECREF(a);
        if (r < 0) Py_CLEAR(out);
    }
    ork_rt_capture_free(&t);
    return out;
}

/* act_stats_rows(x, calls, prefix=0, divisor=None) -> the statistics dict of act_stats_take's items of the rows
 * of x (float32 (M, K)) as a float linear's hook counts its inputs: calls (row counts summing to M) as its
 * calls, the first prefix rows of each counted in ch_absmax only; with divisor (K,) each value divided by it */
PyObject *orkpy_act_stats_rows(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "calls", "prefix", "divisor", NULL};
    PyObject *xo, *calls_o, *div_o = Py_None;
    Py_ssize_t prefix = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|nO:act_stats_rows", kwlist, &xo, &calls_o, &prefix, &div_o))
        return NULL;
    if (prefix < 0) return PyErr_Format(PyExc_ValueError, "prefix must be >= 0, got %zd", prefix);
    PyArrayObject *x = (PyArrayObject *)PyArray_FROM_OTF(xo, NPY_FLOAT32, NPY_ARRAY_IN_ARRAY);
    if (!x) return NULL;
    PyArrayObject *d = NULL;
    PyObject *out = NULL;
    size_t *calls = NULL;
    Py_ssize_t n = 0;
    if (PyArray_NDIM(x) != 2) {
        PyErr_Format(PyExc_ValueError, "x must be 2-D (rows, K), got %d dimensions", PyArray_NDIM(x));
        goto done;
    }
    const size_t M = (size_t)PyArray_DIM(x, 0), K = (size_t)PyArray_DIM(x, 1);
    if (prefix < 0) {
        PyErr_Format(PyExc_ValueError, "prefix is %zd: it must be >= 0", prefix);
        goto done;
    }
    if (div_o != Py_None) {
        d = (PyArrayObject *)PyArray_FROM_OTF(div_o, NPY_FLOAT32, NPY_ARRAY_IN_ARRAY);
        if (!d) goto done;
        if (PyArray_NDIM(d) != 1 || (size_t)PyArray_DIM(d, 0) != K) {
            PyErr_Format(PyExc_ValueError, "divisor must have shape (%zu,), one value per column of x", K);
            goto done;
        }
        const float *dv = (const float *)PyArray_DATA(d);
        for (size_t k = 0; k < K; k++)
            if (!(dv[k] != 0.0f) || !isfinite(dv[k])) {
                PyErr_Format(PyExc_ValueError, "divisor[%zu] is zero or not finite: every divisor must be finite "
                             "and nonzero", k);
                goto done;
            }
    }
    int64_t *c64 = index_list(calls_o, "calls must be a sequence of row counts", &n);
    if (!c64) goto done;
    calls = (size_t *)PyMem_Malloc((size_t)(n ? n : 1) * sizeof *calls);
    for (Py_ssize_t i = 0; calls && i < n; i++) {
        if (c64[i] < 0) {
            PyErr_Format(PyExc_ValueError, "calls[%zd] is %lld: row counts must be >= 0", i, (long long)c64[i]);
            PyMem_Free(c64);
            goto done;
        }
        calls[i] = (size_t)c64[i];
    }
    PyMem_Free(c64);
    if (!calls) {
        PyErr_NoMemory();
        goto done;
    }
    ork_act_stats *st = (ork_act_stats *)calloc(1, sizeof *st);
    float *ch = (float *)calloc(K ? K : 1, sizeof(float));
    if (!st || !ch) {
        free(st);
        free(ch);
        PyErr_NoMemory();
        goto done;
    }
    st->ch_absmax = ch;
    st->skip_rows = (size_t)prefix;
    ork_err err;
    err.msg[0] = '\0';
    ork_status rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ork_act_stats_add_rows(st, (const float *)PyArray_DATA(x), M, K, calls, (size_t)n,
                                d ? (const float *)PyArray_DATA(d) : NULL, &err);
    Py_END_ALLOW_THREADS
    if (rc != ORK_OK) orkpy_raise(rc, &err);
    else out = stats_dict(st, K);
    free(ch);
    free(st);
done:
    PyMem_Free(calls);
    Py_XDECREF(d);
    Py_DECREF(x);
    return out;
}
