/* gguf.h - a strict GGUF (v2, v3) parser over an in-memory buffer.
 *
 * The buffer is untrusted (a memory-mapped file, a fuzzer's input): every
 * count, length, offset and product is checked for overflow and against the
 * buffer size before use. Failures return ORK_EGGUF with a message naming the
 * problem and the byte offset; the parser never reads out of bounds, never
 * allocates more than O(buffer size), never aborts.
 *
 * Layout (ggml docs/gguf.md and src/gguf.cpp; docs/formats.md), all
 * little-endian: magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv |
 * n_kv x (string key, u32 type, value) | n_tensors x (string name, u32 n_dims,
 * u64 ne[n_dims], u32 ggml_type, u64 offset) | pad to alignment | data.
 * A string is u64 length + bytes. An array value is u32 elem_type, u64 count,
 * elements (nested arrays allowed, depth <= ORK_GGUF_MAX_DEPTH).
 *
 * Rules enforced: magic; version 2 or 3 (1 refused as obsolete, a byte-swapped
 * version refused as big-endian); non-empty, unique, valid-UTF-8 keys; known
 * value types; bools 0/1; general.alignment, if present, a u32 power of two;
 * tensor names 1..63 bytes, unique; 1 <= n_dims <= 4; 1 <= ne[i] < 2^63;
 * known ggml type ids (ggml_types.h); ne[0] a multiple of the block size;
 * offsets multiples of the alignment; every tensor's bytes inside the buffer
 * and no two tensors overlapping.
 */
#ifndef ORK_GGUF_H
#define ORK_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define ORK_GGUF_MAX_DEPTH 4
#define ORK_GGUF_MAX_NAME 64 /* tensor names must be shorter (ggml GGML_MAX_NAME) */
#define ORK_GGUF_DEFAULT_ALIGNMENT 32

enum {
    ORK_GGUF_UINT8 = 0, ORK_GGUF_INT8 = 1, ORK_GGUF_UINT16 = 2, ORK_GGUF_INT16 = 3,
    ORK_GGUF_UINT32 = 4, ORK_GGUF_INT32 = 5, ORK_GGUF_FLOAT32 = 6, ORK_GGUF_BOOL = 7,
    ORK_GGUF_STRING = 8, ORK_GGUF_ARRAY = 9, ORK_GGUF_UINT64 = 10, ORK_GGUF_INT64 = 11,
    ORK_GGUF_FLOAT64 = 12, ORK_GGUF_TYPE_COUNT = 13
};

typedef struct ork_gguf_kv {
    uint64_t key_off, key_len; /* key bytes in the buffer */
    uint32_t type;             /* ORK_GGUF_* */
    uint64_t value_off;        /* where the value starts (after the u32 type) */
} ork_gguf_kv;

typedef struct ork_gguf_tensor {
    uint64_t name_off, name_len;
    uint32_t n_dims;
    uint64_t ne[4];      /* ggml order: ne[0] is the row length */
    uint32_t type;       /* ggml type id */
    uint64_t offset;     /* relative to the data section */
    uint64_t data_off;   /* absolute offset in the buffer */
    uint64_t nbytes;
    uint64_t n_elements;
    uint64_t info_off;   /* where this tensor info starts (for messages) */
} ork_gguf_tensor;

typedef struct ork_gguf {
    uint32_t version;
    uint64_t n_kv, n_tensors;
    ork_gguf_kv *kv;
    ork_gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_off; /* start of the data section */
    uint64_t size;     /* buffer size */
} ork_gguf;

/* Parse and validate; on success *g owns two arrays (free with ork_gguf_free).
 * On failure *g is left empty. */
ork_status ork_gguf_parse(const uint8_t *buf, size_t len, ork_gguf *g, ork_err *err);
void ork_gguf_free(ork_gguf *g);

/* Value visitor, used by bindings to build their own objects from a value the
 * parser has already validated. Callbacks return 0 to go on, non-zero to stop
 * (that value is returned from ork_gguf_visit_value as ORK_EINVAL). */
typedef struct ork_gguf_visitor {
    void *ctx;
    /* any scalar (not string/array): its type and little-endian bytes */
    int (*scalar)(void *ctx, uint32_t type, const uint8_t *p);
    int (*string)(void *ctx, const uint8_t *p, uint64_t len);
    /* an array of a fixed-size scalar type: count elements packed at p */
    int (*numeric_array)(void *ctx, uint32_t elem_type, const uint8_t *p, uint64_t count);
    /* an array of strings or of arrays: begin, then each element visited, then end */
    int (*array_begin)(void *ctx, uint32_t elem_type, uint64_t count);
    int (*array_end)(void *ctx);
} ork_gguf_visitor;

ork_status ork_gguf_visit_value(const uint8_t *buf, size_t len, uint32_t type, uint64_t value_off,
                                const ork_gguf_visitor *v, ork_err *err);

/* byte size of a fixed-size value type, 0 for string/array/invalid */
size_t ork_gguf_scalar_size(uint32_t type);
const char *ork_gguf_type_name(uint32_t type);

#endif
