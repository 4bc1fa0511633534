/* py_session.c - orkpy._core.Session: a KV-cached decode session (model.h) over a ForwardModel,
 * which it keeps alive. Every call goes through the model's runtime (csrc/ork/runtime.h), which takes
 * the model's lock (a session and the model's forwards, settings and other sessions never run at
 * once); eval checks the model's mapped files around the step like forward. The ids of the positions
 * held are the core's (ork_session_tokens), recorded under that lock with the caches: sharing a session
 * between threads keeps `tokens` and the caches one state. */
#include "numpy_api.h"

#include "bindings.h"
#include "errors.h"
#include "py_model.h"

typedef struct {
    PyObject_HEAD
    FwdObject *model;
    ork_session *s;
} SessObject;

static PyTypeObject SessType;

static void sess_dealloc(SessObject *self) {
    if (self->s) {
        Py_BEGIN_ALLOW_THREADS
        ork_runtime_session_free(self->model->rt, self->s);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(self->model);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ForwardModel.session(n_ctx, n_batch=512) -> Session */
PyObject *orkpy_fwd_session(FwdObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"n_ctx", "n_batch", NULL};
    Py_ssize_t n_ctx, n_batch = 512;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n|n:session", kwlist, &n_ctx, &n_batch)) return NULL;
    if (orkpy_fwd_ready(self) < 0) return NULL;
    if (n_ctx < 1) return PyErr_Format(PyExc_ValueError, "n_ctx must be >= 1, got %zd", n_ctx);
    if (n_batch < 1) return PyErr_Format(PyExc_ValueError, "n_batch must be >= 1, got %zd", n_batch);
    SessObject *so = PyObject_New(SessObject, &SessType);
    if (!so) return NULL;
    so->s = NULL;
    Py_INCREF(self);
    so->model = self;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_runtime_session_new(self->rt, (size_t)n_ctx, (size_t)n_batch, &so->s, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) {
        Py_DECREF(so);
        return orkpy_raise(st, &err);
    }
    return (PyObject *)so;
}

/* eval(tokens, all_logits=False, threads=0) -> float32 logits (n_vocab,) or (n, n_vocab) */
static PyObject *sess_eval(SessObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"tokens", "all_logits", "threads", NULL};
    PyObject *tok_obj;
    int all = 0, threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|pi:eval", kwlist, &tok_obj, &all, &threads)) return NULL;
    if (orkpy_check_threads(threads) < 0) return NULL;
    PyArrayObject *t = orkpy_tokens_arg(tok_obj);
    if (!t) return NULL;
    const npy_intp n = PyArray_DIM(t, 0), V = (npy_intp)self->model->m->n_vocab;
    npy_intp dims[2] = {n, V};
    PyArrayObject *out = all ? (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT32)
                             : (PyArrayObject *)PyArray_SimpleNew(1, &dims[1], NPY_FLOAT32);
    if (!out) {
        Py_DECREF(t);
        return NULL;
    }
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ORK_OK;
    int bad = orkpy_fwd_check_maps(self->model);
    if (!bad) {
        Py_BEGIN_ALLOW_THREADS
        st = ork_runtime_session_eval(self->model->rt, self->s, (const int32_t *)PyArray_DATA(t), (size_t)n, all,
                                      (float *)PyArray_DATA(out), threads, &err);
        Py_END_ALLOW_THREADS
        bad = orkpy_fwd_check_maps(self->model); /* a file that changed during the step voids its result */
    }
    return orkpy_fwd_pass_result(bad, st, &err, t, out);
}

/* rewind(pos): keep the first pos tokens */
static PyObject *sess_rewind(SessObject *self, PyObject *args) {
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "n:rewind", &pos)) return NULL;
    if (pos < 0) return PyErr_Format(PyExc_ValueError, "pos must be >= 0, got %zd", pos);
    ork_err err;
    err.msg[0] = '\0';
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ork_runtime_session_rewind(self->model->rt, self->s, (size_t)pos, &err);
    Py_END_ALLOW_THREADS
    if (st != ORK_OK) return orkpy_raise(st, &err);
    Py_RETURN_NONE;
}

/* pos and tokens are read under the model's lock (waited for without the GIL), as eval and rewind change them */
static PyObject *sess_pos(SessObject *self, void *closure) {
    (void)closure;
    size_t pos;
    Py_BEGIN_ALLOW_THREADS
    pos = ork_runtime_session_pos(self->model->rt, self->s);
    Py_END_ALLOW_THREADS
    return PyLong_FromSize_t(pos);
}

/* the ids of the positions held, in the caches' order: recorded by the core in the step that fills the caches */
static PyObject *sess_tokens(SessObject *self, void *closure) {
    (void)closure;
    const size_t cap = ork_session_n_ctx(self->s); /* fixed when the session was made */
    int32_t *ids = PyMem_RawMalloc(cap * sizeof *ids);
    if (!ids) return PyErr_NoMemory();
    size_t n;
    Py_BEGIN_ALLOW_THREADS
    n = ork_runtime_session_tokens(self->model->rt, self->s, ids);
    Py_END_ALLOW_THREADS
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *v = PyLong_FromLong(ids[i]);
        if (!v) Py_CLEAR(out);
        else PyList_SET_ITEM(out, (Py_ssize_t)i, v);
    }
    PyMem_RawFree(ids);
    return out;
}

static PyObject *sess_n_ctx(SessObject *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(ork_session_n_ctx(self->s));
}

static PyMethodDef sess_methods[] = {
    {"eval", (PyCFunction)(void (*)(void))sess_eval, METH_VARARGS | METH_KEYWORDS,
     "eval(tokens, all_logits=False, threads=0) -> float32 logits of the last token (n_vocab,) or of every "
     "appended token (n, n_vocab)"},
    {"rewind", (PyCFunction)sess_rewind, METH_VARARGS, "rewind(pos): forget every position >= pos"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef sess_getset[] = {
    {"pos", (getter)sess_pos, NULL, "tokens the session holds (the next token's position)", NULL},
    {"tokens", (getter)sess_tokens, NULL, "the ids of the positions held, in order (a new list)", NULL},
    {"n_ctx", (getter)sess_n_ctx, NULL, "positions the KV cache holds", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SessType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "orkpy._core.Session",
    .tp_basicsize = sizeof(SessObject),
    .tp_dealloc = (destructor)sess_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a KV-cached decode session of a ForwardModel (ForwardModel.session)",
    .tp_methods = sess_methods,
    .tp_getset = sess_getset,
};

int orkpy_session_init(PyObject *module) {
    if (PyType_Ready(&SessType) < 0) return -1;
    if (PyModule_AddObjectRef(module, "Session", (PyObject *)&SessType) < 0) return -1;
    return 0;
}
