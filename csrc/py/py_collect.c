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

/* gram_enable(indices): start accumulating the input Gram matrix (linear.h) of the linears at these
 * positions of linear_names; replaces a collection in progress */
PyObject *orkpy_fwd_gram_enable(FwdObject *self, PyObject *args) {
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "O", &seq) || orkpy_fwd_ready(self) < 0) return NULL;
    PyObject *fast = PySequence_Fast(seq, "gram_enable expects a sequence of linear indices");
    if (!fast) return NULL;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int64_t *idx = (int64_t *)PyMem_Malloc((size_t)(n ? n : 1) * sizeof *idx);
    if (!idx) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t i = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(fast, k), PyExc_OverflowError);
        if (i == -1 && PyErr_Occurred()) {
            PyMem_Free(idx);
            Py_DECREF(fast);
            return NULL;
        }
        idx[k] = (int64_t)i;
    }
    Py_DECREF(fast);
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
        const ork_act_stats *s = &t.st[i];
        npy_intp K = (npy_intp)ork_runtime_linear(self->rt, i)->K, B = ORK_ASTATS_BINS;
        PyArrayObject *ch = (PyArrayObject *)PyArray_SimpleNew(1, &K, NPY_FLOAT32);
        PyArrayObject *c = (PyArrayObject *)PyArray_SimpleNew(1, &B, NPY_UINT64);
        PyArrayObject *s1 = (PyArrayObject *)PyArray_SimpleNew(1, &B, NPY_FLOAT64);
        PyArrayObject *s2 = (PyArrayObject *)PyArray_SimpleNew(1, &B, NPY_FLOAT64);
        if (!ch || !c || !s1 || !s2) {
            Py_XDECREF(ch);
            Py_XDECREF(c);
            Py_XDECREF(s1);
            Py_XDECREF(s2);
            Py_CLEAR(out);
            break;
        }
        memcpy(PyArray_DATA(ch), s->ch_absmax, (size_t)K * sizeof(float));
        memcpy(PyArray_DATA(c), s->count, sizeof s->count);
        memcpy(PyArray_DATA(s1), s->sum, sizeof s->sum);
        memcpy(PyArray_DATA(s2), s->sum2, sizeof s->sum2);
        PyObject *item = Py_BuildValue("{s:K,s:K,s:d,s:N,s:N,s:N,s:N}", "rows", (unsigned long long)s->rows,
                                       "n_clipped", (unsigned long long)s->n_clipped, "absmax", (double)s->absmax,
                                       "ch_absmax", ch, "count", c, "sum", s1, "sum2", s2);
        if (!item) { /* "N" steals the arrays even on failure */
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
