/* py_model.c - orkpy._core.ForwardModel: a model description (hyper-
 * parameters + arrays for every tensor, each linear on its weight path) handed to the core's
 * runtime (csrc/ork/runtime.h: it owns the model, its lock, the collections' buffers and the FFN
 * and NPU settings), with the arrays kept alive by the object. The collections are bound in
 * py_collect.c, the decode sessions in py_session.c. */
#include "numpy_api.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../ork/affine.h"
#include "../ork/ffn_chain.h"
#include "../ork/model.h"
#include "../ork/pack.h"
#include "bindings.h"
#include "errors.h"
#include "py_model.h"

int orkpy_fwd_check_maps(FwdObject *self) {
    if (!self->maps) return 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(self->maps); i++)
        if (orkpy_map_check(PyList_GET_ITEM(self->maps, i)) < 0) return -1;
    return 0;
}

static int fwd_collect_maps(FwdObject *self) {
    Py_XDECREF(self->maps);
    if (!(self->maps = PyList_New(0))) return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(self->keep); i++) {
        PyObject *m = orkpy_map_of(PyList_GET_ITEM(self->keep, i));
        if (!m) continue;
        int have = PySequence_Contains(self->maps, m);
        int r = have ? 0 : PyList_Append(self->maps, m);
        Py_DECREF(m);
        if (have < 0 || r < 0) return -1;
    }
    return 0;
}

int orkpy_fwd_ready(FwdObject *self) {
    if (self->rt && self->m->layers) return 0;
    PyErr_SetString(PyExc_RuntimeError, "the model is not initialised");
    return -1;
}

PyObject *orkpy_fwd_pass_result(int bad, ork_status st, const ork_err *err, PyArrayObject *t, PyArrayObject *out) {
    Py_DECREF(t);
    if (bad >= 0 && st == ORK_OK) return (PyObject *)out;
    Py_DECREF(out);
    return bad < 0 ? NULL : orkpy_raise(st, err);
}

/* a setting's owner (runtime.h "Owners"): a reference the binding handed the runtime */
static void release_owner(void *owner) { Py_DECREF((PyObject *)owner); }

static void fwd_dealloc(FwdObject *self) {
    ork_runtime_free(self->rt, release_owner); /* first: the model points into what the references keep */
    Py_XDECREF(self->keep);
    Py_XDECREF(self->maps);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* float32 C-contiguous array with ndim dims, kept alive by the list `keep` */
static const float *keep_f32(PyObject *keep, PyObject *obj, int ndim, const char *name, npy_intp *dims) {
    PyArrayObject *a = orkpy_as_exact(obj, NPY_FLOAT32, ndim, name);
    if (!a) return NULL;
    if (PyList_Append(keep, (PyObject *)a) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    Py_DECREF(a);
    if (dims)
        for (int d = 0; d < ndim; d++) dims[d] = PyArray_DIM(a, d);
    return (const float *)PyArray_DATA(a);
}

static int get_size(PyObject *d, const char *key, size_t *out) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v) {
        PyErr_Format(PyExc_KeyError, "hparams is missing '%s'", key);
        return -1;
    }
    Py_ssize_t n = PyLong_AsSsize_t(v);
    if (n < 0) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "hparams '%s' must be >= 0", key);
        return -1;
    }
    *out = (size_t)n;
    return 0;
}

static int get_float(PyObject *d, const char *key, float *out) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v) {
        PyErr_Format(PyExc_KeyError, "hparams is missing '%s'", key);
        return -1;
    }
    double x = PyFloat_AsDouble(v);
    if (x == -1.0 && PyErr_Occurred()) return -1;
    *out = (float)x;
    if (!isfinite(*out)) {
        char val[40]; /* CPython's formatter has no float conversion (%g would lose the value): C formats it */
        snprintf(val, sizeof val, "%.9g", x);
        PyErr_Format(PyExc_ValueError, "'%s' = %s is not a finite float32", key, val);
        return -1;
    }
    return 0;
}

/* item `key` of a packed linear's dict, or NULL with a KeyError */
static PyObject *packed_item(PyObject *d, const char *key, const char *name) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v) PyErr_Format(PyExc_KeyError, "%s: the packed linear has no '%s'", name, key);
    return v;
}

/* ("f32", w) or ("packed", {kind, store, bscale, N, K, group, act}): LinearSpec.to_core()
 * (orkpy/runtime/linear.py); its arrays are appended to the list `keep`.
 * group 0 or a group size below K with bscale (N, G) (linear.h); act the activation spec's dict, read by
 * orkpy_act_spec_from_py (coerce.c), or None for per token */
static int parse_linear(PyObject *keep, PyObject *spec, ork_linear *l, const char *name) {
    static const char *const keys[] = {"kind", "store", "bscale", "N", "K", "group", "act", "boffset", NULL};
    memset(l, 0, sizeof *l);
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2) {
        PyErr_Format(PyExc_TypeError, "%s: linear spec must be a tuple (path, value)", name);
        return -1;
    }
    const char *path = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0));
    if (!path) return -1;
    PyObject *arg = PyTuple_GET_ITEM(spec, 1);
    if (strcmp(path, "f32") == 0) {
        npy_intp dims[2];
        l->path = ORK_LIN_F32;
        if (!(l->w = keep_f32(keep, arg, 2, name, dims))) return -1;
        l->N = (size_t)dims[0];
        l->K = (size_t)dims[1];
        return 0;
    }
    if (strcmp(path, "packed") != 0) {
        PyErr_Format(PyExc_ValueError, "%s: unknown linear spec '%s'", name, path);
        return -1;
    }
    char what[64];
    snprintf(what, sizeof what, "%s: packed linear", name);
    if (orkpy_dict_keys_in(arg, keys, what) < 0) return -1;
    PyObject *kind_o, *store_o, *bscale_o, *n_o, *k_o;
    if (!(kind_o = packed_item(arg, "kind", name)) || !(store_o = packed_item(arg, "store", name)) ||
        !(bscale_o = packed_item(arg, "bscale", name)) || !(n_o = packed_item(arg, "N", name)) ||
        !(k_o = packed_item(arg, "K", name)))
        return -1;
    const char *kind_s = PyUnicode_AsUTF8(kind_o);
    const ork_kind_info *ki = kind_s ? orkpy_parse_kind(kind_s) : NULL;
    if (!ki) return -1;
    l->kind = ki->id;
    Py_ssize_t N = PyLong_AsSsize_t(n_o), K = PyLong_AsSsize_t(k_o);
    if (N <= 0 || K <= 0) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: bad packed shape", name);
        return -1;
    }
    PyArrayObject *store = orkpy_as_store(store_o, ki, N, K, name);
    if (!store) return -1;
    int r = PyList_Append(keep, (PyObject *)store);
    Py_DECREF(store);
    if (r < 0) return -1;
    l->store = PyArray_DATA(store);
    Py_ssize_t group = 0;
    PyObject *g_o = PyDict_GetItemString(arg, "group");
    if (g_o && g_o != Py_None && (group = PyLong_AsSsize_t(g_o)) < 0) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: group size must be >= 0", name);
        return -1;
    }
    const size_t G = group && group < K ? ork_group_count((size_t)K, (size_t)group) : 1;
    l->group = G > 1 ? (size_t)group : 0;
    npy_intp bd[2] = {0, 1};
    if (!(l->bscale = keep_f32(keep, bscale_o, G > 1 ? 2 : 1, name, bd))) return -1;
    if (bd[0] != N || (size_t)bd[1] != G) {
        PyErr_Format(PyExc_ValueError, "%s: bscale has shape (%zd, %zd), expected (%zd, %zu)", name,
                     (Py_ssize_t)bd[0], (Py_ssize_t)bd[1], N, G);
        return -1;
    }
    PyObject *bo_o = PyDict_GetItemString(arg, "boffset");
    if (bo_o && bo_o != Py_None) { /* affine groups (affine.h): offsets shaped as bscale */
        npy_intp od[2] = {0, 0};
        if (!(l->boffset = keep_f32(keep, bo_o, 2, name, od))) return -1;
        if (od[0] != N || (size_t)od[1] != G) {
            PyErr_Format(PyExc_ValueError, "%s: boffset has shape (%zd, %zd), expected bscale's (%zd, %zu)", name,
                         (Py_ssize_t)od[0], (Py_ssize_t)od[1], N, G);
            return -1;
        }
    }
    PyObject *act_o = PyDict_GetItemString(arg, "act"), *act_keep = NULL;
    if (orkpy_act_spec_from_py(act_o ? act_o : Py_None, (size_t)K, &l->act, &act_keep, name) < 0) return -1;
    if (act_keep) {
        r = PyList_Append(keep, act_keep);
        Py_DECREF(act_keep);
        if (r < 0) return -1;
    }
    ork_err err; /* the door of a packed linear: codes, scales and its activation settings (pack.h, linear.h) */
    err.msg[0] = '\0';
    l->path = ORK_LIN_PACKED;
    l->N = (size_t)N;
    l->K = (size_t)K;
    ork_status st = ork_group_check((size_t)group, &err);
    if (st == ORK_OK) st = ork_pack_check_store(l->kind, l->store, (size_t)N, (size_t)K, &err);
    if (st == ORK_OK) st = ork_pack_check_gscales(l->bscale, (size_t)N, G, (size_t)K, ORK_EINVAL, &err);
    if (st == ORK_OK && l->boffset) st = ork_affine_check_offsets(l->boffset, (size_t)N, G, ORK_EINVAL, &err);
    if (st == ORK_OK) st = ork_linear_check_act(l, &err);
    if (st != ORK_OK) {
        orkpy_raise_named(st, name, &err);
        return -1;
    }
    return 0;
}

static const float *opt_vec(FwdObject *self, PyObject *d, const char *key) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v || v == Py_None) return NULL;
    return keep_f32(self->keep, v, 1, key, NULL);
}

/* an optional 1-D float32 array of exactly n entries (NULL, no error, when absent or None) */
static const float *opt_vec_n(FwdObject *self, PyObject *v, const char *what, size_t layer, size_t n) {
    if (!v || v == Py_None) return NULL;
    npy_intp dims[1];
    const float *p = keep_f32(self->keep, v, 1, what, dims);
    if (p && (size_t)dims[0] != n) {
        PyErr_Format(PyExc_ValueError, "layer %zu: %s has %zd entries, expected %zu", layer, what, (Py_ssize_t)dims[0], n);
        return NULL;
    }
    return p;
}

/* optional hparams: absent means the default 0 (off) */
static int opt_float(PyObject *d, const char *key, float *out) {
    *out = 0.0f;
    return PyDict_GetItemString(d, key) ? get_float(d, key, out) : 0;
}
static int opt_size(PyObject *d, const char *key, size_t *out) {
    *out = 0;
    return PyDict_GetItemString(d, key) ? get_size(d, key, out) : 0;
}

/* layer dict key "<stem>.bias" of linear j (NULL when absent), its length checked */
static int linear_bias(FwdObject *self, PyObject *d, ork_linear *l, const char *stem, size_t layer) {
    char key[64];
    snprintf(key, sizeof key, "%s.bias", stem);
    PyObject *v = PyDict_GetItemString(d, key);
    l->bias = opt_vec_n(self, v, key, layer, l->N);
    return PyErr_Occurred() ? -1 : 0;
}

static int fwd_init(FwdObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"hparams", "tok_embd", "out_norm", "output", "layers", "output_bias", "rope_freqs", NULL};
    PyObject *hp, *emb, *onorm, *out, *layers, *out_bias = NULL, *rope_freqs = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOOO!|OO:ForwardModel", kwlist, &PyDict_Type, &hp, &emb, &onorm, &out,
                                     &PyList_Type, &layers, &out_bias, &rope_freqs))
        return -1;
    if (self->keep) {
        PyErr_SetString(PyExc_RuntimeError, "a ForwardModel cannot be initialised twice");
        return -1;
    }
    self->keep = PyList_New(0);
    if (!self->keep) return -1;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_runtime_new(&self->rt, &err);
    if (st != ORK_OK) {
        orkpy_raise(st, &err);
        return -1;
    }
    ork_model *m = self->m = ork_runtime_model(self->rt);
    size_t rope_type = 0;
    if (get_size(hp, "n_layer", &m->n_layer) || get_size(hp, "n_embd", &m->n_embd) || get_size(hp, "n_head", &m->n_head) ||
        get_size(hp, "n_head_kv", &m->n_head_kv) || get_size(hp, "head_dim", &m->head_dim) ||
        get_size(hp, "n_ff", &m->n_ff) || get_size(hp, "n_vocab", &m->n_vocab) || get_size(hp, "n_rot", &m->n_rot) ||
        get_size(hp, "rope_type", &rope_type) || get_float(hp, "rope_base", &m->rope_base) ||
        get_float(hp, "rope_freq_scale", &m->rope_freq_scale) || get_float(hp, "norm_eps", &m->norm_eps))
        return -1;
    if (rope_type != ORK_ROPE_NORM && rope_type != ORK_ROPE_NEOX) {
        PyErr_Format(PyExc_ValueError, "unknown rope_type %zu", rope_type);
        return -1;
    }
    m->rope_type = (ork_rope_type)rope_type;
    size_t act = 0; /* the optional features (model.h): absent keys leave them off */
    if (opt_size(hp, "gate_fn", &act) || opt_float(hp, "embd_scale", &m->embd_scale) ||
        opt_float(hp, "attn_scale", &m->attn_scale) || opt_float(hp, "attn_softcap", &m->attn_softcap) ||
        opt_float(hp, "final_softcap", &m->final_softcap) || opt_float(hp, "rope_attn_factor", &m->rope_attn_factor) ||
        opt_size(hp, "n_ctx_max", &m->n_ctx_max))
        return -1;
    if (act >= ORK_ACT_COUNT) {
        PyErr_Format(PyExc_ValueError, "unknown activation %zu", act);
        return -1;
    }
    m->act = (ork_act)act;
    if ((size_t)PyList_GET_SIZE(layers) != m->n_layer) {
        PyErr_Format(PyExc_ValueError, "%zd layers given, hparams say %zu", PyList_GET_SIZE(layers), m->n_layer);
        return -1;
    }
    npy_intp ed[2];
    if (emb != Py_None) { /* None: the lookup reads the head's rows (a tied model, model.h) */
        if (!(m->tok_embd = keep_f32(self->keep, emb, 2, "tok_embd", ed))) return -1;
        if ((size_t)ed[0] != m->n_vocab || (size_t)ed[1] != m->n_embd) {
            PyErr_SetString(PyExc_ValueError, "tok_embd shape does not match (n_vocab, n_embd)");
            return -1;
        }
    }
    if (!(m->out_norm = keep_f32(self->keep, onorm, 1, "out_norm", NULL))) return -1;
    if (parse_linear(self->keep, out, &m->output, "output") < 0) return -1;
    m->output.bias = opt_vec_n(self, out_bias, "output_bias", m->n_layer, m->output.N);
    if (PyErr_Occurred()) return -1;
    m->rope_freqs = opt_vec_n(self, rope_freqs, "rope_freqs", 0, m->n_rot / 2);
    if (PyErr_Occurred()) return -1;
    if ((st = ork_runtime_alloc_layers(self->rt, m->n_layer, &err)) != ORK_OK) {
        orkpy_raise(st, &err);
        return -1;
    }
    for (size_t i = 0; i < m->n_layer; i++) {
        PyObject *d = PyList_GET_ITEM(layers, (Py_ssize_t)i);
        if (!PyDict_Check(d)) {
            PyErr_Format(PyExc_TypeError, "layer %zu must be a dict", i);
            return -1;
        }
        ork_layer *L = ork_runtime_layer(self->rt, i);
        if (!(L->attn_norm = opt_vec(self, d, "attn_norm")) || !(L->ffn_norm = opt_vec(self, d, "ffn_norm"))) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "layer %zu is missing a norm", i);
            return -1;
        }
        L->q_norm = opt_vec(self, d, "q_norm");
        if (PyErr_Occurred()) return -1;
        L->k_norm = opt_vec(self, d, "k_norm");
        if (PyErr_Occurred()) return -1;
        L->post_attn_norm = opt_vec_n(self, PyDict_GetItemString(d, "post_attn_norm"), "post_attn_norm", i, m->n_embd);
        if (PyErr_Occurred()) return -1;
        L->post_ffn_norm = opt_vec_n(self, PyDict_GetItemString(d, "post_ffn_norm"), "post_ffn_norm", i, m->n_embd);
        if (PyErr_Occurred()) return -1;
        PyObject *rot = PyDict_GetItemString(d, "ffn_down.rot");
        if (rot && rot != Py_None) { /* the online down rotation's p x p block (model.h) */
            npy_intp dims[2];
            if (!(L->down_rot = keep_f32(self->keep, rot, 2, "ffn_down.rot", dims))) return -1;
            if (dims[0] != dims[1]) {
                PyErr_Format(PyExc_ValueError, "layer %zu: ffn_down.rot must be square, got %zd x %zd", i,
                             (Py_ssize_t)dims[0], (Py_ssize_t)dims[1]);
                return -1;
            }
            L->down_rot_p = (size_t)dims[0];
        }
        PyObject *nrot = PyDict_GetItemString(d, "norm.rot");
        if (nrot && nrot != Py_None) { /* the online block-input rotation's p x p block (model.h) */
            npy_intp dims[2];
            if (!(L->norm_rot = keep_f32(self->keep, nrot, 2, "norm.rot", dims))) return -1;
            if (dims[0] != dims[1]) {
                PyErr_Format(PyExc_ValueError, "layer %zu: norm.rot must be square, got %zd x %zd", i,
                             (Py_ssize_t)dims[0], (Py_ssize_t)dims[1]);
                return -1;
            }
            L->norm_rot_p = (size_t)dims[0];
        }
        if (opt_size(d, "n_swa", &L->n_swa) || opt_float(d, "rope_base", &L->rope_base) ||
            opt_float(d, "rope_freq_scale", &L->rope_freq_scale))
            return -1;
        for (int j = 0; j < ORK_LAYER_LINEARS; j++) { /* keyed by the forward model's linear names (model.h) */
            const char *key = ork_layer_linear_names[j];
            PyObject *spec = PyDict_GetItemString(d, key);
            if (!spec) {
                PyErr_Format(PyExc_KeyError, "layer %zu is missing '%s'", i, key);
                return -1;
            }
            if (parse_linear(self->keep, spec, ork_layer_linear(L, j), key) < 0) return -1;
            if (linear_bias(self, d, ork_layer_linear(L, j), key, i) < 0) return -1;
        }
    }
    if ((st = ork_runtime_check(self->rt, &err)) != ORK_OK) {
        orkpy_raise(st, &err);
        return -1;
    }
    return fwd_collect_maps(self);
}


PyArrayObject *orkpy_tokens_arg(PyObject *obj) {
    PyArrayObject *raw = (PyArrayObject *)PyArray_FROM_O(obj);
    if (!raw) return NULL;
    if (PyArray_SIZE(raw) > 0 && !PyArray_ISINTEGER(raw)) {
        PyErr_Format(PyExc_TypeError, "token ids must be integers, got dtype %S", (PyObject *)PyArray_DESCR(raw));
        Py_DECREF(raw);
        return NULL;
    }
    PyArrayObject *wide = (PyArrayObject *)PyArray_FROM_OTF((PyObject *)raw, NPY_INT64, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    Py_DECREF(raw);
    if (!wide) return NULL;
    const int64_t *w = (const int64_t *)PyArray_DATA(wide);
    for (npy_intp i = 0; i < PyArray_SIZE(wide); i++)
        if (w[i] < 0 || w[i] > 0x7fffffff) {
            PyErr_Format(PyExc_ValueError, "token id %lld at index %zd is out of range", (long long)w[i], (Py_ssize_t)i);
            Py_DECREF(wide);
            return NULL;
        }
    PyArrayObject *t = (PyArrayObject *)PyArray_FROM_OTF((PyObject *)wide, NPY_INT32, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    Py_DECREF(wide);
    if (!t) return NULL;
    if (PyArray_NDIM(t) != 1 || PyArray_DIM(t, 0) < 1) {
        PyErr_SetString(PyExc_ValueError, "tokens must be a non-empty 1-D integer array");
        Py_DECREF(t);
        return NULL;
    }
    return t;
}


static PyObject *fwd_forward(FwdObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"tokens", "first", "threads", "out", NULL};
    PyObject *tok_obj, *out_obj = Py_None;
    Py_ssize_t first = 0;
    int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|niO:forward", kwlist, &tok_obj, &first, &threads, &out_obj))
        return NULL;
    if (orkpy_check_threads(threads) < 0 || orkpy_fwd_ready(self) < 0) return NULL;
    PyArrayObject *t = orkpy_tokens_arg(tok_obj);
    if (!t) return NULL;
    npy_intp T = PyArray_DIM(t, 0);
    if (first < 0 || first >= T) {
        Py_DECREF(t);
        return PyErr_Format(PyExc_ValueError, "first must be in [0, %zd), got %zd", (Py_ssize_t)T, first);
    }
    npy_intp dims[2] = {T - first, (npy_intp)self->m->n_vocab};
    PyArrayObject *out;
    if (out_obj == Py_None) {
        out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    } else if (!PyArray_Check(out_obj) || PyArray_TYPE((PyArrayObject *)out_obj) != NPY_FLOAT32 ||
               !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)out_obj) || !PyArray_ISWRITEABLE((PyArrayObject *)out_obj)) {
        Py_DECREF(t);
        return PyErr_Format(PyExc_TypeError, "out must be a writeable C-contiguous float32 ndarray");
    } else if (PyArray_NDIM((PyArrayObject *)out_obj) != 2 || PyArray_DIM((PyArrayObject *)out_obj, 0) != dims[0] ||
               PyArray_DIM((PyArrayObject *)out_obj, 1) != dims[1]) {
        Py_DECREF(t);
        return PyErr_Format(PyExc_ValueError, "out must have shape (%zd, %zd) (the rows first..T-1 x n_vocab)",
                            (Py_ssize_t)dims[0], (Py_ssize_t)dims[1]);
    } else {
        Py_INCREF(out_obj);
        out = (PyArrayObject *)out_obj;
    }
    if (!out) {
        Py_DECREF(t);
        return NULL;
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ORK_OK;
    int bad = orkpy_fwd_check_maps(self);
    if (!bad) {
        Py_BEGIN_ALLOW_THREADS
        st = ork_runtime_forward(self->rt, (const int32_t *)PyArray_DATA(t), (size_t)T, (size_t)first,
                                 (float *)PyArray_DATA(out), threads, &err);
        Py_END_ALLOW_THREADS
        bad = orkpy_fwd_check_maps(self); /* a file that changed during the pass voids its result */
    }
    return orkpy_fwd_pass_result(bad, st, &err, t, out);
}


/* forward_hidden(x, layers=-1, first=0, logits=False, threads=0) -> logits or None: the first `layers` layers
 * (-1: all) run on the hidden rows x (float32 (T, n_embd), C-contiguous, writeable; updated in place), then
 * with logits=True the head on rows first..T-1 (model.h ork_model_forward_hidden) */
static PyObject *fwd_forward_hidden(FwdObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"x", "layers", "first", "logits", "threads", NULL};
    PyObject *x_obj;
    Py_ssize_t layers = -1, first = 0;
    int want = 0, threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|nnpi:forward_hidden", kwlist, &x_obj, &layers, &first, &want,
                                     &threads))
        return NULL;
    if (orkpy_check_threads(threads) < 0 || orkpy_fwd_ready(self) < 0) return NULL;
    if (!PyArray_Check(x_obj) || PyArray_TYPE((PyArrayObject *)x_obj) != NPY_FLOAT32 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)x_obj) || !PyArray_ISWRITEABLE((PyArrayObject *)x_obj) ||
        PyArray_NDIM((PyArrayObject *)x_obj) != 2)
        return PyErr_Format(PyExc_TypeError, "x must be a writeable C-contiguous 2-D float32 ndarray");
    PyArrayObject *x = (PyArrayObject *)x_obj;
    const npy_intp T = PyArray_DIM(x, 0);
    if ((size_t)PyArray_DIM(x, 1) != self->m->n_embd || T < 1)
        return PyErr_Format(PyExc_ValueError, "x must have shape (T >= 1, n_embd = %zu)", self->m->n_embd);
    if (layers < 0) layers = (Py_ssize_t)self->m->n_layer;
    if ((size_t)layers > self->m->n_layer)
        return PyErr_Format(PyExc_ValueError, "layers must be in [0, %zu], got %zd", self->m->n_layer, layers);
    if (want && (first < 0 || first >= T))
        return PyErr_Format(PyExc_ValueError, "first must be in [0, %zd), got %zd", (Py_ssize_t)T, first);
    PyArrayObject *out = NULL;
    if (want) {
        npy_intp dims[2] = {T - first, (npy_intp)self->m->n_vocab};
        if (!(out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT32))) return NULL;
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ORK_OK;
    int bad = orkpy_fwd_check_maps(self);
    if (!bad) {
        Py_BEGIN_ALLOW_THREADS
        st = ork_runtime_forward_hidden(self->rt, (float *)PyArray_DATA(x), (size_t)T, (size_t)layers, (size_t)first,
                                        out ? (float *)PyArray_DATA(out) : NULL, threads, &err);
        Py_END_ALLOW_THREADS
        bad = orkpy_fwd_check_maps(self);
    }
    if (bad < 0 || st != ORK_OK) {
        Py_XDECREF(out);
        return bad < 0 ? NULL : orkpy_raise(st, &err);
    }
    if (out) return (PyObject *)out;
    Py_RETURN_NONE;
}


PyObject *orkpy_nll_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *l_obj, *t_obj;
    int threads = 0;
    if (!PyArg_ParseTuple(args, "OO|i:nll_rows", &l_obj, &t_obj, &threads) || orkpy_check_threads(threads) < 0)
        return NULL;
    PyArrayObject *l = orkpy_as_exact(l_obj, NPY_FLOAT32, 2, "logits");
    if (!l) return NULL;
    PyArrayObject *t = orkpy_tokens_arg(t_obj);
    if (!t) {
        Py_DECREF(l);
        return NULL;
    }
    npy_intp rows = PyArray_DIM(l, 0);
    if (PyArray_DIM(t, 0) != rows) {
        Py_DECREF(l);
        Py_DECREF(t);
        return PyErr_Format(PyExc_ValueError, "%zd targets for %zd logit rows", (Py_ssize_t)PyArray_DIM(t, 0),
                            (Py_ssize_t)rows);
    }
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(1, &rows, NPY_FLOAT64);
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ORK_ENOMEM;
    if (out) {
        Py_BEGIN_ALLOW_THREADS
        st = ork_nll_rows((const float *)PyArray_DATA(l), (size_t)rows, (size_t)PyArray_DIM(l, 1),
                          (const int32_t *)PyArray_DATA(t), (double *)PyArray_DATA(out), threads, &err);
        Py_END_ALLOW_THREADS
    }
    Py_DECREF(l);
    Py_DECREF(t);
    if (!out) return NULL;
    if (st != ORK_OK) {
        Py_DECREF(out);
        return orkpy_raise(st, &err);
    }
    return (PyObject *)out;
}



/* ffn_lut(step, act=0) -> (int16[1024], scale): the chain's LUT of activation act (act.h's ork_act) */
PyObject *orkpy_ffn_lut(PyObject *self, PyObject *args) {
    (void)self;
    double step;
    int act = ORK_ACT_SILU;
    if (!PyArg_ParseTuple(args, "d|i:ffn_lut", &step, &act)) return NULL;
    if (!(step > 0) || !isfinite(step)) return PyErr_Format(PyExc_ValueError, "LUT step must be positive and finite");
    if (act < 0 || act >= ORK_ACT_COUNT) return PyErr_Format(PyExc_ValueError, "unknown activation %d", act);
    npy_intp n = ORK_FFN_LUT;
    PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_INT16);
    if (!a) return NULL;
    float sc;
    ork_ffn_make_lut((float)step, (ork_act)act, (int16_t *)PyArray_DATA(a), &sc);
    return Py_BuildValue("(Nd)", a, (double)sc);
}

PyObject *orkpy_ffn_modes(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *t = PyTuple_New(ORK_FFN_MODE_COUNT - 1);
    for (int i = 1; t && i < ORK_FFN_MODE_COUNT; i++) {
        PyObject *s = PyUnicode_FromString(ork_ffn_mode_names[i]);
        if (!s) Py_CLEAR(t);
        else PyTuple_SET_ITEM(t, i - 1, s);
    }
    return t;
}

PyObject *orkpy_layer_linears(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *t = PyTuple_New(ORK_LAYER_LINEARS);
    for (int j = 0; t && j < ORK_LAYER_LINEARS; j++) {
        PyObject *s = PyUnicode_FromString(ork_layer_linear_names[j]);
        if (!s) Py_CLEAR(t);
        else PyTuple_SET_ITEM(t, j, s);
    }
    return t;
}

/* linear_names(hparams): the names of ork_model_linear_name for hparams['n_layer'] layers */
PyObject *orkpy_linear_names(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyDict_Check(arg)) return PyErr_Format(PyExc_TypeError, "hparams must be a dict");
    size_t n_layer;
    if (get_size(arg, "n_layer", &n_layer) < 0) return NULL;
    if (n_layer > ORK_MODEL_MAX_LAYERS) return PyErr_Format(PyExc_ValueError, "n_layer = %zu is out of range", n_layer);
    const size_t n = ork_model_linear_count(n_layer);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        char name[64];
        PyObject *s = ork_model_linear_name(n_layer, i, name, sizeof name) == 0 ? PyUnicode_FromString(name) : NULL;
        if (!s) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "linear name does not fit");
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, s);
    }
    return out;
}


/* ffn_apply(layer, h) -> y: one layer's FFN chain on given normed inputs (tests, debugging) */
static PyObject *fwd_ffn_apply(FwdObject *self, PyObject *args) {
    Py_ssize_t li;
    PyObject *h_obj;
    if (!PyArg_ParseTuple(args, "nO:ffn_apply", &li, &h_obj) || orkpy_fwd_ready(self) < 0) return NULL;
    if (li < 0 || (size_t)li >= self->m->n_layer) return PyErr_Format(PyExc_IndexError, "layer %zd out of range", li);
    PyArrayObject *h = orkpy_as_exact(h_obj, NPY_FLOAT32, 2, "h");
    if (!h) return NULL;
    if ((size_t)PyArray_DIM(h, 1) != self->m->n_embd || PyArray_DIM(h, 0) < 1) {
        Py_DECREF(h);
        return PyErr_Format(PyExc_ValueError, "h must have shape (T, n_embd)");
    }
    npy_intp dims[2] = {PyArray_DIM(h, 0), (npy_intp)self->m->n_embd};
    PyArrayObject *y = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ORK_ENOMEM;
    if (y && orkpy_fwd_check_maps(self) < 0) Py_CLEAR(y);
    if (y) {
        Py_BEGIN_ALLOW_THREADS
        st = ork_runtime_ffn_apply(self->rt, (size_t)li, (const float *)PyArray_DATA(h), (size_t)dims[0],
                                   (float *)PyArray_DATA(y), &err);
        Py_END_ALLOW_THREADS
        if (orkpy_fwd_check_maps(self) < 0) Py_CLEAR(y);
    }
    Py_DECREF(h);
    if (!y) return NULL;
    if (st != ORK_OK) {
        Py_DECREF(y);
        return orkpy_raise(st, &err);
    }
    return (PyObject *)y;
}

/* set_npu(index, NPUWeight or None): run linear `index` (linear_names order)
 * through an NPU backend; the weight must hold that linear's int8 values. The route holds a reference to
 * the weight (the runtime's owner of the route, swapped with it under the model's lock); the one it
 * replaces is released. The device check (its lock) and the route (the model's) run without the GIL. */
static PyObject *fwd_set_npu(FwdObject *self, PyObject *args) {
    Py_ssize_t idx;
    PyObject *wo;
    if (!PyArg_ParseTuple(args, "nO:set_npu", &idx, &wo) || orkpy_fwd_ready(self) < 0) return NULL;
    const size_t n = ork_runtime_n_linears(self->rt);
    if (idx < 0 || (size_t)idx >= n) return PyErr_Format(PyExc_IndexError, "linear index %zd outside [0, %zu)", idx, n);
    ork_npu_dweight *w = NULL;
    if (wo != Py_None && !(w = orkpy_npu_weight_of(wo))) return NULL;
    PyObject *owner = w ? wo : NULL;
    void *replaced = NULL;
    ork_int_mm_fn fn = NULL;
    void *ctx = NULL;
    size_t N = 0, K = 0, group = 0;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_XINCREF(owner);
    Py_BEGIN_ALLOW_THREADS
    st = w ? ork_npu_dweight_hook(w, &fn, &ctx, &N, &K, &group, &err) : ORK_OK;
    if (st == ORK_OK) st = ork_runtime_set_int_mm(self->rt, (size_t)idx, fn, ctx, N, K, group, owner, &replaced, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        Py_XDECREF(owner);
        return orkpy_raise(st, &err);
    }
    Py_XDECREF((PyObject *)replaced);
    Py_RETURN_NONE;
}

/* set_linear(index, spec): replace linear `index` (linear_names order) by another spec of the
 * same shape (parse_linear's (path, value)); its bias and statistics hooks are kept, its NPU route is
 * dropped (it held the old weight's values). The new linear's arrays live in a list that is the
 * runtime's owner of the linear: the linear it replaces is released with its arrays (those of the
 * described linears stay in `keep`), as is the dropped route's weight. */
static PyObject *fwd_set_linear(FwdObject *self, PyObject *args) {
    Py_ssize_t idx;
    PyObject *spec;
    if (!PyArg_ParseTuple(args, "nO:set_linear", &idx, &spec) || orkpy_fwd_ready(self) < 0) return NULL;
    const size_t n = ork_runtime_n_linears(self->rt);
    if (idx < 0 || (size_t)idx >= n) return PyErr_Format(PyExc_IndexError, "linear index %zd outside [0, %zu)", idx, n);
    ork_linear tmp;
    char name[32];
    snprintf(name, sizeof name, "linear %zd", idx);
    PyObject *owner = PyList_New(0);
    if (!owner) return NULL;
    if (parse_linear(owner, spec, &tmp, name) < 0) {
        Py_DECREF(owner);
        return NULL;
    }
    void *replaced = NULL, *unrouted = NULL;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_runtime_set_linear(self->rt, (size_t)idx, &tmp, owner, &replaced, &unrouted, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        Py_DECREF(owner);
        return orkpy_raise(st, &err);
    }
    Py_XDECREF((PyObject *)replaced);
    Py_XDECREF((PyObject *)unrouted);
    Py_RETURN_NONE;
}

/* set_ffn(layer, None | dict(mode, lut_step, s_scale, u_scale, p_scale, zp=0, s_scale_ch=None)) */
static PyObject *fwd_set_ffn(FwdObject *self, PyObject *args) {
    Py_ssize_t li;
    PyObject *d;
    if (!PyArg_ParseTuple(args, "nO:set_ffn", &li, &d) || orkpy_fwd_ready(self) < 0) return NULL;
    if (li < 0 || (size_t)li >= self->m->n_layer)
        return PyErr_Format(PyExc_IndexError, "layer %zd out of range (model has %zu)", li, self->m->n_layer);
    ork_ffn_params p;
    memset(&p, 0, sizeof p);
    PyArrayObject *ch_arr = NULL;
    if (d != Py_None) {
        if (!PyDict_Check(d)) return PyErr_Format(PyExc_TypeError, "FFN settings must be a dict or None");
        PyObject *mode_obj = PyDict_GetItemString(d, "mode");
        if (!mode_obj || !PyUnicode_Check(mode_obj))
            return PyErr_Format(PyExc_ValueError, "FFN settings need a 'mode' string");
        const char *mode = PyUnicode_AsUTF8(mode_obj);
        if (!mode) return NULL;
        static const char *const required[4] = {"lut_step", "s_scale", "u_scale", "p_scale"};
        for (int i = 0; i < 4; i++)
            if (!PyDict_GetItemString(d, required[i]))
                return PyErr_Format(PyExc_ValueError, "FFN settings are missing '%s'", required[i]);
        if (!(p.mode = ork_ffn_mode_find(mode))) return PyErr_Format(PyExc_ValueError, "unknown FFN chain mode '%s'", mode);
        if (get_float(d, "lut_step", &p.lut_step) || get_float(d, "s_scale", &p.s_scale) ||
            get_float(d, "u_scale", &p.u_scale) || get_float(d, "p_scale", &p.p_scale))
            return NULL;
        PyObject *zp = PyDict_GetItemString(d, "zp");
        if (zp) {
            int overflow = 0;
            long long z = PyLong_AsLongLongAndOverflow(zp, &overflow);
            if (z == -1 && PyErr_Occurred()) return NULL;
            /* clamped into int32; ork_ffn_check refuses anything outside int8 */
            p.zp = overflow > 0 || z > INT32_MAX ? INT32_MAX : overflow < 0 || z < INT32_MIN ? INT32_MIN : (int32_t)z;
        }
        PyObject *ch = PyDict_GetItemString(d, "s_scale_ch");
        if (ch && ch != Py_None) {
            if (!(ch_arr = orkpy_as_exact(ch, NPY_FLOAT32, 1, "s_scale_ch"))) return NULL;
            if ((size_t)PyArray_DIM(ch_arr, 0) != self->m->n_ff) {
                Py_DECREF(ch_arr);
                return PyErr_Format(PyExc_ValueError, "s_scale_ch must have n_ff entries");
            }
            p.s_scale_ch = (const float *)PyArray_DATA(ch_arr);
        }
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    void *replaced = NULL;
    /* ch_arr (or NULL) becomes the setting's owner; the one it replaces is released */
    Py_BEGIN_ALLOW_THREADS
    st = ork_runtime_set_ffn(self->rt, (size_t)li, d == Py_None ? NULL : &p, ch_arr, &replaced, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        Py_XDECREF(ch_arr);
        return orkpy_raise(st, &err);
    }
    Py_XDECREF((PyObject *)replaced);
    Py_RETURN_NONE;
}

static PyMethodDef fwd_methods[] = {
    {"set_linear", (PyCFunction)fwd_set_linear, METH_VARARGS,
     "set_linear(index, spec): replace a linear by another of the same shape (a sensitivity scan)"},
    {"set_npu", (PyCFunction)fwd_set_npu, METH_VARARGS,
     "set_npu(index, NPUWeight or None): run a packed linear's int8 matmul on an NPU backend"},
    {"ffn_apply", (PyCFunction)fwd_ffn_apply, METH_VARARGS, "ffn_apply(layer, h) -> the layer's FFN chain output"},
    {"set_ffn", (PyCFunction)fwd_set_ffn, METH_VARARGS, "set_ffn(layer, settings or None): FFN chain mode of a layer"},
    {"ffn_stats_enable", (PyCFunction)orkpy_fwd_ffn_stats_enable, METH_NOARGS, "start collecting prep-pass FFN statistics"},
    {"ffn_stats_take", (PyCFunction)orkpy_fwd_ffn_stats_take, METH_NOARGS, "-> per-layer FFN statistics; stops"},
    {"act_stats_enable", (PyCFunction)orkpy_fwd_act_stats_enable, METH_VARARGS,
     "act_stats_enable(prefix=0): start collecting activation statistics (|x| histogram, per-channel max) of every "
     "linear's input, the first prefix positions of the block linears left out"},
    {"act_stats_take", (PyCFunction)orkpy_fwd_act_stats_take, METH_NOARGS,
     "-> [dict(rows, n_clipped, absmax, ch_absmax, count, sum, sum2)] per linear in linear_names order; stops"},
    {"gram_enable", (PyCFunction)orkpy_fwd_gram_enable, METH_VARARGS,
     "gram_enable(indices): start accumulating the input Gram matrix sum x^T x of the linears at these positions"},
    {"gram_take", (PyCFunction)orkpy_fwd_gram_take, METH_NOARGS, "-> {index: (G float64 (K, K), rows)}; stops"},
    {"capture_enable", (PyCFunction)orkpy_fwd_capture_enable, METH_VARARGS,
     "capture_enable(indices, rows): start capturing the input rows of the linears at these positions (room for rows)"},
    {"capture_take", (PyCFunction)orkpy_fwd_capture_take, METH_NOARGS,
     "-> {index: float32 (rows, K) of the captured inputs}; stops"},
    {"imatrix_enable", (PyCFunction)orkpy_fwd_imatrix_enable, METH_NOARGS,
     "start accumulating sum x^2 per input channel of every linear"},
    {"imatrix_take", (PyCFunction)orkpy_fwd_imatrix_take, METH_NOARGS,
     "-> [(sums, count)] per linear in linear_names(hparams) order; stops"},
    {"forward", (PyCFunction)(void (*)(void))fwd_forward, METH_VARARGS | METH_KEYWORDS,
     "forward(tokens, first=0, threads=0, out=None) -> float32 logits (T - first, n_vocab), written into out when given"},
    {"forward_hidden", (PyCFunction)(void (*)(void))fwd_forward_hidden, METH_VARARGS | METH_KEYWORDS,
     "forward_hidden(x, layers=-1, first=0, logits=False, threads=0) -> logits or None: layers on hidden rows x "
     "(in place), then the head"},
    {"session", (PyCFunction)(void (*)(void))orkpy_fwd_session, METH_VARARGS | METH_KEYWORDS,
     "session(n_ctx, n_batch=512) -> Session: a KV-cached decode session with n_ctx positions"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FwdType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "orkpy._core.ForwardModel",
    .tp_basicsize = sizeof(FwdObject),
    .tp_dealloc = (destructor)fwd_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ForwardModel(hparams, tok_embd, out_norm, output, layers): the C forward pass",
    .tp_methods = fwd_methods,
    .tp_init = (initproc)fwd_init,
    .tp_new = PyType_GenericNew,
};


int orkpy_model_init(PyObject *module) {
    if (PyType_Ready(&FwdType) < 0) return -1;
    if (PyModule_AddObjectRef(module, "ForwardModel", (PyObject *)&FwdType) < 0) return -1;
    return orkpy_session_init(module);
}
