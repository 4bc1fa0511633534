/* py_model.h - the ForwardModel object, shared by py_model.c (description, forward, settings),
 * py_collect.c (the statistics collections) and py_session.c (decode sessions). The state lives
 * in the core's runtime (csrc/ork/runtime.h: the model, its lock, the collections' buffers, the FFN
 * settings, the NPU routes); the object holds the Python references the model points into. The binding
 * never waits for the model's lock with the GIL held: every runtime call that locks runs between
 * Py_BEGIN_ALLOW_THREADS and Py_END_ALLOW_THREADS. */
#ifndef ORKPY_PY_MODEL_H
#define ORKPY_PY_MODEL_H

#include <Python.h>

#include "../ork/runtime.h"

typedef struct {
    PyObject_HEAD
    ork_runtime *rt; /* NULL until initialised */
    ork_model *m;    /* the runtime's model (read-only once initialised) */
    PyObject *keep;  /* list of the arrays the description points into */
    PyObject *maps;  /* list of the distinct MappedFiles the kept arrays view (checked around a pass) */
    /* the settings' references (an NPU route's NPUWeight, a replaced linear's arrays, an FFN setting's
     * s_scale_ch) are the runtime's owners (runtime.h "Owners"), swapped with the settings under its lock */
} FwdObject;

/* every file the model's arrays map still unchanged (docs/security.md), else -1 with FormatError */
int orkpy_fwd_check_maps(FwdObject *self);
/* 0 when initialised, else -1 with a RuntimeError */
int orkpy_fwd_ready(FwdObject *self);
/* the end of a pass run between two map checks: `bad` < 0 when a mapped file changed before or during it
 * (the Python error is set; the result is void), else the pass's status. Drops `t`; returns `out` or NULL
 * with the exception set (dropping `out`). */
PyObject *orkpy_fwd_pass_result(int bad, ork_status st, const ork_err *err, PyArrayObject *t, PyArrayObject *out);
/* token ids -> int32 1-D non-empty array (new reference), or NULL with an exception */
PyArrayObject *orkpy_tokens_arg(PyObject *obj);

/* py_collect.c: the ForwardModel methods of the collections */
PyObject *orkpy_fwd_imatrix_enable(FwdObject *self, PyObject *unused);
PyObject *orkpy_fwd_imatrix_take(FwdObject *self, PyObject *unused);
PyObject *orkpy_fwd_gram_enable(FwdObject *self, PyObject *args);
PyObject *orkpy_fwd_gram_take(FwdObject *self, PyObject *unused);
PyObject *orkpy_fwd_capture_enable(FwdObject *self, PyObject *args);
PyObject *orkpy_fwd_capture_take(FwdObject *self, PyObject *unused);
PyObject *orkpy_fwd_act_stats_enable(FwdObject *self, PyObject *args);
PyObject *orkpy_fwd_act_stats_take(FwdObject *self, PyObject *unused);
PyObject *orkpy_fwd_ffn_stats_enable(FwdObject *self, PyObject *unused);
PyObject *orkpy_fwd_ffn_stats_take(FwdObject *self, PyObject *unused);

/* py_session.c: ForwardModel.session and the Session type */
PyObject *orkpy_fwd_session(FwdObject *self, PyObject *args, PyObject *kw);
int orkpy_session_init(PyObject *module);

#endif
