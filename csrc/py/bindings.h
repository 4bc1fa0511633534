/* bindings.h - functions exported by the binding files other than module.c */
#ifndef ORKPY_BINDINGS_H
#define ORKPY_BINDINGS_H

#include <Python.h>

#include "../ork/linear.h"
#include "../ork/quant.h"

/* coerce.c: boundary coercion (set a Python exception and return NULL / -1 on failure) */
struct tagPyArrayObject;
/* float32, C-contiguous, aligned; non-floating dtypes -> TypeError, wrong ndim -> ValueError */
struct tagPyArrayObject *orkpy_as_float32(PyObject *obj, int ndim, const char *name);
/* exactly this dtype and ndim, C-contiguous (no value-changing casts) */
struct tagPyArrayObject *orkpy_as_exact(PyObject *obj, int typenum, int ndim, const char *name);
/* the kind registry row named s (quant.h), or NULL with a ValueError listing the kinds */
const ork_kind_info *orkpy_parse_kind(const char *s);
/* NumPy dtype of a kind's codes and packed store: int8 for 8-bit kinds, uint8 for 4-bit ones */
int orkpy_code_typenum(const ork_kind_info *k);
int orkpy_check_threads(int threads);
/* 0 when every key of dict d is one of keys (NULL-terminated); else -1 with a TypeError (not a dict) or a
 * ValueError naming `what` and the key */
int orkpy_dict_keys_in(PyObject *d, const char *const *keys, const char *what);
/* The one reader of an activation spec (actspec.h) from Python: orkpy.ActSpec.to_core()'s dict
 * {mode: str, bits: int, clip: float (0 = none), prefix: int, outliers: None or a 1-D int32 array}
 * (absent keys: ORK_ACT_SPEC_INIT's values), or None for the per-token default. Checked by
 * ork_act_spec_check for K inputs; exceptions name `name`. *keep receives a new reference to the
 * outliers array (or NULL), which the caller holds while the spec is used. 0, or -1 with an exception. */
int orkpy_act_spec_from_py(PyObject *obj, size_t K, ork_act_spec *spec, PyObject **keep, const char *name);

/* py_gguf.c: find_nonfinite(a, threads=0) -> flat index of the first NaN / Inf of a float32 / float16
 * array, or -1 */
PyObject *orkpy_find_nonfinite(PyObject *self, PyObject *args, PyObject *kw);

/* py_pack.c */
PyObject *orkpy_pack(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_unpack(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_matmul_int(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_matmul(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_packed_header(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_packed_parse(PyObject *self, PyObject *arg);
/* packed_check(store, kind, N, K, bscale): the PackedWeight constructor's door (codes, scales) */
PyObject *orkpy_packed_check(PyObject *self, PyObject *args, PyObject *kw);
/* packed_layout(kind, N, K) -> dict: the store's shape/dtype/bytes and the O4N1/O8N1 file offsets */
PyObject *orkpy_packed_layout(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_store_to_file(PyObject *self, PyObject *args);
PyObject *orkpy_store_from_file(PyObject *self, PyObject *args);
PyObject *orkpy_store_padding_check(PyObject *self, PyObject *args);
/* f16_from_f32(float32 (n,)) -> uint16 (n,), f16_to_f32(uint16 (n,)) -> float32: half.h's codec */
PyObject *orkpy_f16_from_f32(PyObject *self, PyObject *arg);
PyObject *orkpy_f16_to_f32(PyObject *self, PyObject *arg);
/* the store array of a packed weight, exact dtype and shape (pack.h ork_pack_store_shape), or NULL */
struct tagPyArrayObject *orkpy_as_store(PyObject *obj, const ork_kind_info *k, Py_ssize_t N, Py_ssize_t K,
                                        const char *name);

/* py_i4.c: the int4 x int4 matmul contract (csrc/ork/i4.h). i4_layout(K) -> dict(Kp, row_bytes, kchunk,
 * n_chunks, max_k); i4_pack(codes int8 (rows, K)) -> uint8 (rows, Kp/2); i4_unpack(packed, K) -> int8 (rows, K);
 * mm_i4(a, w, K, threads=0) -> int32 (M, N); mm_i4_partials(a, w, K) -> int16 (n_chunks, M, N) */
PyObject *orkpy_i4_layout(PyObject *self, PyObject *arg);
PyObject *orkpy_i4_pack(PyObject *self, PyObject *arg);
PyObject *orkpy_i4_unpack(PyObject *self, PyObject *args);
PyObject *orkpy_mm_i4(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_mm_i4_partials(PyObject *self, PyObject *args, PyObject *kw);

/* py_gptq.c: gptq(w, gram, kind, damp, block, rows, group, static_groups, threads) -> (codes, scales);
 * gptq_factor(h, threads) -> U, the upper Cholesky factor of inv(h) (csrc/ork/gptq.h) */
PyObject *orkpy_gptq(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_gptq_factor(PyObject *self, PyObject *args, PyObject *kw);
/* hadamard_rows(x, hp, scale, threads) -> None: x <- scale * x kron(hp, H_m) in place (csrc/ork/hadamard.h) */
PyObject *orkpy_hadamard_rows(PyObject *self, PyObject *args);

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

/* py_model.c (with py_collect.c and py_session.c: py_model.h) */
int orkpy_model_init(PyObject *module);
PyObject *orkpy_nll_rows(PyObject *self, PyObject *args);
PyObject *orkpy_ffn_lut(PyObject *self, PyObject *arg);
PyObject *orkpy_ffn_hist_edges(PyObject *self, PyObject *unused);  /* py_collect.c */
PyObject *orkpy_act_stats_edges(PyObject *self, PyObject *unused); /* py_collect.c */
PyObject *orkpy_act_stats_rows(PyObject *self, PyObject *args, PyObject *kw); /* py_collect.c */
PyObject *orkpy_range_mse(PyObject *self, PyObject *args);         /* py_collect.c */
/* ffn_modes() -> tuple of the FFN chain's mode names (ffn_chain.h) */
PyObject *orkpy_ffn_modes(PyObject *self, PyObject *unused);
/* linear_names(hparams) -> list of the forward model's linear tensor names, in its order (model.h) */
PyObject *orkpy_linear_names(PyObject *self, PyObject *arg);
/* layer_linears() -> tuple of a layer's linear keys (the GGUF stems), in order */
PyObject *orkpy_layer_linears(PyObject *self, PyObject *unused);

/* py_npu.c */
PyObject *orkpy_npu_matmul_task(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_npu_names(PyObject *self, PyObject *args);
/* npu_int4_facts() -> the int4 task's register values and what each rests on (regcmd.h) */
PyObject *orkpy_npu_int4_facts(PyObject *self, PyObject *unused);
PyObject *orkpy_npu_plan(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_npu_plan_emit(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_npu_layout(PyObject *self, PyObject *args, PyObject *kw);
/* npu_chain_plan(shapes, ...) / npu_chain_emit(shapes, cmd_addr, in_addr, w_addrs, out_addr, ...): chained jobs (plan.h) */
PyObject *orkpy_npu_chain_plan(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_npu_chain_emit(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_npu_emulate(PyObject *self, PyObject *args, PyObject *kw);
PyObject *orkpy_npu_probe(PyObject *self, PyObject *arg);
/* _npu_install_fake_kernel_for_tests(address): test-only (csrc/ork/npu/device.h, "test kernels") */
PyObject *orkpy_npu_install_fake_kernel_for_tests(PyObject *self, PyObject *arg);
/* npu_backends() -> tuple of the backend names (backend.h) */
PyObject *orkpy_npu_backends(PyObject *self, PyObject *unused);
/* npu_pc_amount(body_qwords) -> PC_REGISTER_AMOUNTS for a task body (regcmd.h) */
PyObject *orkpy_npu_pc_amount(PyObject *self, PyObject *arg);
/* argument helpers shared by py_npu.c and py_npu_device.c (-1 with an exception): v in [0, 2^32) named `name`;
 * the per-task tile caps max_m, max_k, max_n (0 = hardware limit), the precision; a backend by name (a ValueError
 * listing them) */
#include "../ork/npu/backend.h"
#include "../ork/npu/device.h"
int orkpy_u32_arg(long long v, const char *name, uint32_t *out);
int orkpy_npu_caps_arg(long long mm, long long mk, long long mn, ork_npu_plan_opts *o);
/* precision "int8" (or NULL) / "int4" into o (after orkpy_npu_caps_arg, which zeroes o) */
int orkpy_npu_prec_arg(const char *s, ork_npu_plan_opts *o);
int orkpy_npu_backend_arg(const char *s, ork_npu_backend_kind *kind);
/* py_npu_device.c: the NPUDevice / NPUWeight / NPUJob types */
int orkpy_npu_init(PyObject *module);
/* the core weight of an NPUWeight (no lock: its hook and liveness come from ork_npu_dweight_hook, called
 * without the GIL), or NULL with a TypeError if obj is not one */
ork_npu_dweight *orkpy_npu_weight_of(PyObject *obj);

#endif
