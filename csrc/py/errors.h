/* errors.h - the one table that maps ork_status to Python exceptions. */
#ifndef ORKPY_ERRORS_H
#define ORKPY_ERRORS_H

#include <Python.h>

#include "../ork/status.h"

/* Creates orkpy's own exception classes and adds them to the module. */
int orkpy_errors_init(PyObject *module);
/* Sets a Python exception for st (st != ORK_OK) with err's message (or a
 * generic one) and returns NULL, so callers can `return orkpy_raise(...)`. */
PyObject *orkpy_raise(ork_status st, const ork_err *err);
/* The same with a ready message (e.g. one that names a file); returns NULL. */
PyObject *orkpy_raise_text(ork_status st, PyObject *text);
/* The same with err's message after "name: " (the linear, file or argument it is about); returns NULL. */
PyObject *orkpy_raise_named(ork_status st, const char *name, const ork_err *err);

#endif
