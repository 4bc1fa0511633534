/* numpy_api.h - the one way a binding file other than module.c includes Python and NumPy:
 * the shared array-API table (PY_ARRAY_UNIQUE_SYMBOL) that module.c imports once
 * (import_array), so every other file defines NO_IMPORT_ARRAY. Include it first. */
#ifndef ORKPY_NUMPY_API_H
#define ORKPY_NUMPY_API_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL orkpy_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#endif
