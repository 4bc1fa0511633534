/* py_map.c - orkpy._core.MappedFile: a read-only, guarded file mapping
 * (csrc/ork/mapguard.h) with the buffer protocol, len() and byte indexing /
 * slicing like mmap.mmap, plus check(): FormatError naming the file when it
 * changed while mapped. The mapping lives until the last buffer export (e.g.
 * a NumPy view) is released and the object is collected. */
#include "numpy_api.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <structmember.h>

#include "../ork/mapguard.h"
#include "bindings.h"
#include "errors.h"

typedef struct {
    PyObject_HEAD
    ork_mapped m;
    PyObject *path; /* str */
    Py_ssize_t exports;
    int open;
} MapObject;

static PyTypeObject MapType;

static PyObject *map_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path", "fd", NULL};
    PyObject *path_arg, *fd_arg = Py_None, *fs = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:MappedFile", kwlist, &path_arg, &fd_arg)) return NULL;
    int fd = -1;
    if (fd_arg != Py_None) { /* map this open descriptor (a duplicate of it); path only names it */
        fd = PyObject_AsFileDescriptor(fd_arg);
        if (fd < 0) return NULL;
    }
    if (!PyUnicode_FSConverter(path_arg, &fs)) return NULL;
    MapObject *self = (MapObject *)type->tp_alloc(type, 0);
    if (!self) {
        Py_DECREF(fs);
        return NULL;
    }
    self->m.fd = -1;
    self->m.slot = -1;
    self->path = PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(fs));
    if (!self->path) {
        Py_DECREF(fs);
        Py_DECREF(self);
        return NULL;
    }
    ork_err err;
    err.msg[0] = '\0';
    int os_errno = 0;
    ork_status st;
    Py_BEGIN_ALLOW_THREADS
    if (fd >= 0) {
        int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (dup < 0) {
            os_errno = errno;
            st = ork_err_set(&err, ORK_EIO, "%s", strerror(os_errno));
        } else {
            st = ork_mapped_open_fd(dup, &self->m, &os_errno, &err);
        }
    } else {
        st = ork_mapped_open(PyBytes_AS_STRING(fs), &self->m, &os_errno, &err);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(fs);
    if (st != ORK_OK) {
        if (st == ORK_EIO && os_errno) {
            errno = os_errno;
            PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, self->path);
        } else {
            orkpy_raise(st, &err);
        }
        Py_DECREF(self);
        return NULL;
    }
    self->open = 1;
    return (PyObject *)self;
}

static void map_dealloc(MapObject *self) {
    ork_mapped_close(&self->m);
    Py_XDECREF(self->path);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int map_closed(MapObject *self) {
    if (self->open) return 0;
    PyErr_SetString(PyExc_ValueError, "mapped file closed");
    return 1;
}

static int map_getbuffer(MapObject *self, Py_buffer *view, int flags) {
    if (map_closed(self)) return -1;
    static char empty[1];
    void *buf = self->m.data ? (void *)self->m.data : (void *)empty;
    if (PyBuffer_FillInfo(view, (PyObject *)self, buf, (Py_ssize_t)self->m.size, 1, flags) < 0) return -1;
    self->exports++;
    return 0;
}

static void map_releasebuffer(MapObject *self, Py_buffer *view) {
    (void)view;
    self->exports--;
}

static PyBufferProcs map_as_buffer = {(getbufferproc)map_getbuffer, (releasebufferproc)map_releasebuffer};

static Py_ssize_t map_length(MapObject *self) {
    if (map_closed(self)) return -1;
    return (Py_ssize_t)self->m.size;
}

static PyObject *map_subscript(MapObject *self, PyObject *item) {
    if (map_closed(self)) return NULL;
    Py_ssize_t n = (Py_ssize_t)self->m.size;
    if (PyIndex_Check(item)) {
        Py_ssize_t i = PyNumber_AsSsize_t(item, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred()) return NULL;
        if (i < 0) i += n;
        if (i < 0 || i >= n) {
            PyErr_SetString(PyExc_IndexError, "mapped file index out of range");
            return NULL;
        }
        return PyLong_FromLong(self->m.data[i]);
    }
    if (PySlice_Check(item)) {
        Py_ssize_t start, stop, step;
        if (PySlice_Unpack(item, &start, &stop, &step) < 0) return NULL;
        Py_ssize_t len = PySlice_AdjustIndices(n, &start, &stop, step);
        if (step == 1) return PyBytes_FromStringAndSize(len ? (const char *)self->m.data + start : "", len);
        PyObject *b = PyBytes_FromStringAndSize(NULL, len);
        if (!b) return NULL;
        char *d = PyBytes_AS_STRING(b);
        for (Py_ssize_t i = 0, j = start; i < len; i++, j += step) d[i] = (char)self->m.data[j];
        return b;
    }
    return PyErr_Format(PyExc_TypeError, "mapped file indices must be integers or slices, not %.200s",
                        Py_TYPE(item)->tp_name);
}

static PyMappingMethods map_as_mapping = {(lenfunc)map_length, (binaryfunc)map_subscript, NULL};

/* FormatError "<path>: <what changed>" (or OSError if fstat fails) */
static PyObject *map_check(MapObject *self, PyObject *unused) {
    (void)unused;
    if (map_closed(self)) return NULL;
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_mapped_check(&self->m, &err);
    if (st == ORK_OK) Py_RETURN_NONE;
    if (st == ORK_EIO) return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, self->path);
    PyObject *msg = PyUnicode_FromFormat("%U: %s", self->path, err.msg);
    if (!msg) return NULL;
    orkpy_raise_text(st, msg);
    Py_DECREF(msg);
    return NULL;
}

/* release(offset=0, length=None): drop the resident pages of that byte range (mapguard.h) */
static PyObject *map_release(MapObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"offset", "length", NULL};
    Py_ssize_t offset = 0, length = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|nn:release", kwlist, &offset, &length)) return NULL;
    if (map_closed(self)) return NULL;
    if (offset < 0) return PyErr_Format(PyExc_ValueError, "offset must be >= 0, got %zd", offset);
    if (length < -1) return PyErr_Format(PyExc_ValueError, "length must be >= 0 (or -1: to the end), got %zd", length);
    ork_err err;
    err.msg[0] = '\0';
    ork_status st = ork_mapped_release(&self->m, (size_t)offset, length < 0 ? self->m.size : (size_t)length, &err);
    if (st != ORK_OK) return orkpy_raise(st, &err);
    Py_RETURN_NONE;
}

static PyObject *map_close(MapObject *self, PyObject *unused) {
    (void)unused;
    if (!self->open) Py_RETURN_NONE;
    if (self->exports > 0) {
        PyErr_SetString(PyExc_BufferError, "cannot close a mapped file while arrays view it (it is released with them)");
        return NULL;
    }
    ork_mapped_close(&self->m);
    self->open = 0;
    Py_RETURN_NONE;
}

static PyObject *map_enter(MapObject *self, PyObject *unused) {
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *map_exit(MapObject *self, PyObject *args) {
    (void)args;
    return map_close(self, NULL);
}

static PyObject *map_get_size(MapObject *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(self->m.size);
}

static PyObject *map_get_closed(MapObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(!self->open);
}

static PyObject *map_get_faulted(MapObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(ork_mapped_faulted(&self->m));
}

static PyObject *map_repr(MapObject *self) {
    return PyUnicode_FromFormat("MappedFile(%R, size=%zu%s)", self->path, self->m.size, self->open ? "" : ", closed");
}

/* __buffer__(flags) -> memoryview: the buffer protocol spelled as a method (PEP 688; Python >= 3.12
 * derives the same from the slot), so that type checkers see a Buffer on every version */
static PyObject *map_buffer(MapObject *self, PyObject *flags) {
    (void)flags;
    return PyMemoryView_FromObject((PyObject *)self);
}

static PyMethodDef map_methods[] = {
    {"__buffer__", (PyCFunction)map_buffer, METH_O, "__buffer__(flags) -> memoryview (read-only)"},
    {"check", (PyCFunction)map_check, METH_NOARGS,
     "check(): orkpy.FormatError naming the file if it changed size, was modified or lost pages while mapped"},
    {"release", (PyCFunction)(void (*)(void))map_release, METH_VARARGS | METH_KEYWORDS,
     "release(offset=0, length=-1): drop the resident pages of those bytes from this process (re-read from the file "
     "on the next access; the values never change), so a streaming reader's memory does not grow with the file"},
    {"close", (PyCFunction)map_close, METH_NOARGS,
     "close(): unmap now (BufferError while arrays still view the mapping)"},
    {"__enter__", (PyCFunction)map_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)map_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef map_getset[] = {
    {"size", (getter)map_get_size, NULL, "file size in bytes at open", NULL},
    {"closed", (getter)map_get_closed, NULL, "True after close()", NULL},
    {"faulted", (getter)map_get_faulted, NULL, "True once a read past the file's (new) end was answered with zeros",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef map_members[] = {
    {"path", T_OBJECT_EX, offsetof(MapObject, path), READONLY, "the path as given (str)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject MapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "orkpy._core.MappedFile",
    .tp_basicsize = sizeof(MapObject),
    .tp_dealloc = (destructor)map_dealloc,
    .tp_repr = (reprfunc)map_repr,
    .tp_as_mapping = &map_as_mapping,
    .tp_as_buffer = &map_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "MappedFile(path, fd=None): the whole file mapped read-only (fd: map that open descriptor, "
              "through a duplicate, and path only names it); a read past its end after another process "
              "truncates it yields zeros instead of SIGBUS and check() then raises orkpy.FormatError "
              "(csrc/ork/mapguard.h).",
    .tp_methods = map_methods,
    .tp_members = map_members,
    .tp_getset = map_getset,
    .tp_new = map_new,
};

PyObject *orkpy_map_of(PyObject *obj) {
    for (int i = 0; obj && i < 64; i++) {
        if (Py_IS_TYPE(obj, &MapType)) return Py_NewRef(obj);
        if (PyArray_Check(obj)) obj = PyArray_BASE((PyArrayObject *)obj);
        else if (PyMemoryView_Check(obj)) obj = PyMemoryView_GET_BUFFER(obj)->obj;
        else return NULL;
    }
    return NULL;
}

int orkpy_map_check(PyObject *map) {
    PyObject *r = map_check((MapObject *)map, NULL);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

PyObject *orkpy_mapguard_state(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    int installed = 0, live = 0;
    ork_mapguard_state(&installed, &live);
    return Py_BuildValue("{s:O,s:i}", "installed", installed ? Py_True : Py_False, "mappings", live);
}

int orkpy_map_init(PyObject *module) {
    if (PyType_Ready(&MapType) < 0) return -1;
    return PyModule_AddObjectRef(module, "MappedFile", (PyObject *)&MapType);
}
