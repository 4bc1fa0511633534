/* bindings.h - functions exported by the binding files other than module.c */
#ifndef ORKPY_BINDINGS_H
#define ORKPY_BINDINGS_H

#include <Python.h>

#include "../ork/model.h"
#include "../ork/quant.h"

/* coerce.c: boundary coercion (set a Python exception and return NULL / -1 on failure) */
struct tagPyArrayObject;
/* float32, C-contiguous, aligned; non-floating dtypes -> TypeError, wrong ndim -> ValueError */
struct tagPyArrayObject *orkpy_as_float32(PyObject *obj, int ndim, const char *name);
/* exactly this dtype and ndim, C-contiguous (no value-changing casts) */
struct tagPyArrayObject *orkpy_as_exact(PyObject *obj, int typenum, int ndim, const char *name);
int orkpy_parse_kind(const char *s, ork_kind *kind);
int orkpy_check_threads(int threads);

/* py_pack.c */
PyObject *orkpy_pack(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_unpack(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_matmul_int(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_matmul(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_packed_header(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_packed_parse(PyObject *self, PyObject *arg);
/* packed_check(store, kind, N, K, bscale): the PackedWeight constructor's door (codes, scales) */
PyObject *orkpy_packed_check(PyObject *self, PyObject *args, PyObject *kw);

/* py_map.c: orkpy._core.MappedFile (guarded read-only file mappings, csrc/ork/mapguard.h) */
int orkpy_map_init(PyObject *module);
/* new reference to the MappedFile an array / memoryview (base chain) views, or NULL without an exception */
PyObject *orkpy_map_of(PyObject *obj);
/* 0 while that file is unchanged, else -1 with orkpy.FormatError naming it (MappedFile.check) */
int orkpy_map_check(PyObject *map);
PyObject *orkpy_mapguard_state(PyObject *self, PyObject *unused);

/* gguf_parse(buffer) -> dict(version, alignment, data_offset, metadata=[(key, type, value)],
 *   tensors=[(name, type_id, ne, offset, data_offset, nbytes, info_offset)]) */
PyObject *orkpy_gguf_parse(PyObject *self, PyObject *arg);

/* py_model.c */
int orkpy_model_init(PyObject *module);
PyObject *orkpy_nll_rows(PyObject *self, PyObject *args);
PyObject *orkpy_ffn_lut(PyObject *self, PyObject *arg);
PyObject *orkpy_ffn_hist_edges(PyObject *self, PyObject *unused);

/* py_npu.c */
PyObject *orkpy_npu_matmul_task(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_npu_names(PyObject *self, PyObject *args);
PyObject *orkpy_npu_plan(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_npu_plan_emit(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_npu_layout(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_npu_emulate(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_npu_probe(PyObject *self, PyObject *arg);
int orkpy_npu_init(PyObject *module);
/* the forward-pass hook of an NPUWeight (model.h ork_int_mm_fn); -1 + exception if obj is not a live NPUWeight */
int orkpy_npu_weight_hook(PyObject *obj, ork_int_mm_fn *fn, void **ctx, size_t *N, size_t *K);

#endif
