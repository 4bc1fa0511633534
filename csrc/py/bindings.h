/* bindings.h - functions exported by the binding files other than module.c */
#ifndef ORKPY_BINDINGS_H
#define ORKPY_BINDINGS_H

#include <Python.h>

/* gguf_parse(buffer) -> dict(version, alignment, data_offset, metadata=[(key, type, value)],
 *   tensors=[(name, type_id, ne, offset, data_offset, nbytes, info_offset)]) */
PyObject *orkpy_gguf_parse(PyObject *self, PyObject *arg);

#endif
