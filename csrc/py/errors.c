#include "errors.h"

#include <string.h>

static PyObject *FormatError;   /* orkpy.FormatError(ValueError) */
static PyObject *Unavailable;   /* orkpy.UnavailableError(RuntimeError) */
static PyObject *GGUFError;     /* orkpy.GGUFError(FormatError) */
static PyObject *NPUError;      /* orkpy.NPUError(RuntimeError) */
static PyObject *NPUUnavailable; /* orkpy.NPUUnavailableError(NPUError, UnavailableError) */
static PyObject *NPUTimeout;    /* orkpy.NPUTimeoutError(NPUError, TimeoutError) */
static PyObject *NPUCommand;    /* orkpy.NPUCommandError(NPUError) */

int orkpy_errors_init(PyObject *module) {
    FormatError = PyErr_NewExceptionWithDoc(
        "orkpy.FormatError", "A file orkpy reads is malformed (bad magic, size, offset, value).",
        PyExc_ValueError, NULL);
    if (!FormatError || PyModule_AddObjectRef(module, "FormatError", FormatError) < 0) return -1;
    Unavailable = PyErr_NewExceptionWithDoc(
        "orkpy.UnavailableError",
        "A requested kernel or device is not available on this machine or build.",
        PyExc_RuntimeError, NULL);
    if (!Unavailable || PyModule_AddObjectRef(module, "UnavailableError", Unavailable) < 0)
        return -1;
    GGUFError = PyErr_NewExceptionWithDoc(
        "orkpy.GGUFError", "A GGUF file is malformed; the message names the problem and byte offset.",
        FormatError, NULL);
    if (!GGUFError || PyModule_AddObjectRef(module, "GGUFError", GGUFError) < 0) return -1;
    NPUError = PyErr_NewExceptionWithDoc(
        "orkpy.NPUError", "An NPU driver or device call failed; the message names the call and errno.",
        PyExc_RuntimeError, NULL);
    if (!NPUError || PyModule_AddObjectRef(module, "NPUError", NPUError) < 0) return -1;
    PyObject *bases = PyTuple_Pack(2, NPUError, Unavailable);
    if (!bases) return -1;
    NPUUnavailable = PyErr_NewExceptionWithDoc(
        "orkpy.NPUUnavailableError",
        "The requested NPU backend is not usable here (no device, driver or libdrm); the message says why.",
        bases, NULL);
    Py_DECREF(bases);
    if (!NPUUnavailable || PyModule_AddObjectRef(module, "NPUUnavailableError", NPUUnavailable) < 0) return -1;
    bases = PyTuple_Pack(2, NPUError, PyExc_TimeoutError);
    if (!bases) return -1;
    NPUTimeout = PyErr_NewExceptionWithDoc("orkpy.NPUTimeoutError", "An NPU job did not finish within its timeout.",
                                           bases, NULL);
    Py_DECREF(bases);
    if (!NPUTimeout || PyModule_AddObjectRef(module, "NPUTimeoutError", NPUTimeout) < 0) return -1;
    NPUCommand = PyErr_NewExceptionWithDoc(
        "orkpy.NPUCommandError",
        "A command stream or driver call the strict emulator / fake kernel does not accept (unmodelled "
        "register or value, broken PC chain, violated driver contract).",
        NPUError, NULL);
    if (!NPUCommand || PyModule_AddObjectRef(module, "NPUCommandError", NPUCommand) < 0) return -1;
    return 0;
}

static PyObject *exception_for(ork_status st) {
    switch (st) {
    case ORK_EINVAL: return PyExc_ValueError;
    case ORK_ENONFINITE: return PyExc_ValueError;
    case ORK_ENOMEM: return PyExc_MemoryError;
    case ORK_ETHREAD: return PyExc_RuntimeError;
    case ORK_EFORMAT: return FormatError;
    case ORK_EIO: return PyExc_OSError;
    case ORK_ENOTIMPL: return PyExc_NotImplementedError;
    case ORK_EUNAVAIL: return Unavailable;
    case ORK_EGGUF: return GGUFError;
    case ORK_ENPUUNAVAIL: return NPUUnavailable;
    case ORK_ENPU: return NPUError;
    case ORK_ETIMEDOUT: return NPUTimeout;
    case ORK_ENPUCMD: return NPUCommand;
    case ORK_ESTATE: return PyExc_RuntimeError;
    default: return PyExc_RuntimeError;
    }
}

PyObject *orkpy_raise_text(ork_status st, PyObject *text) {
    PyErr_SetObject(exception_for(st), text);
    return NULL;
}

PyObject *orkpy_raise_named(ork_status st, const char *name, const ork_err *err) {
    PyObject *text = PyUnicode_FromFormat("%s: %s", name, (err && err->msg[0]) ? err->msg : ork_status_name(st));
    if (text) {
        PyErr_SetObject(exception_for(st), text);
        Py_DECREF(text);
    }
    return NULL;
}

PyObject *orkpy_raise(ork_status st, const ork_err *err) {
    const char *msg = (err && err->msg[0]) ? err->msg : ork_status_name(st);
    if (st == ORK_ENOMEM && !(err && err->msg[0])) return PyErr_NoMemory();
    /* messages may quote bytes from untrusted files: decode leniently */
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    if (!text) return NULL;
    PyErr_SetObject(exception_for(st), text);
    Py_DECREF(text);
    return NULL;
}
