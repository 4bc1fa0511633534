/* ggml_types.h - the ggml tensor type table (ids as in ggml's enum ggml_type).
 *
 * Source of the facts: ggml include/ggml.h (enum ggml_type), src/ggml-common.h
 * (block structs and their static_asserts), src/ggml.c type_traits, cross-checked
 * with gguf-py GGML_QUANT_SIZES (gguf-py/gguf/constants.py).
 * Ids 4, 5 (Q4_2/Q4_3), 31-33 (Q4_0_4_4/4_8/8_8) and 36-38 (IQ4_NL_4_4/4_8/8_8)
 * were removed from ggml and are invalid here. Q8_1 uses ggml's 36-byte block
 * (gguf-py says 40; Q8_1 is an activation-only type that files should not hold).
 * bits per weight = 8 * type_size / block_size.
 */
#ifndef ORK_GGML_TYPES_H
#define ORK_GGML_TYPES_H

#include <stddef.h>
#include <stdint.h>

enum {
    ORK_GGML_F32 = 0, ORK_GGML_F16 = 1, ORK_GGML_Q4_0 = 2, ORK_GGML_Q4_1 = 3,
    ORK_GGML_Q5_0 = 6, ORK_GGML_Q5_1 = 7, ORK_GGML_Q8_0 = 8, ORK_GGML_Q8_1 = 9,
    ORK_GGML_Q2_K = 10, ORK_GGML_Q3_K = 11, ORK_GGML_Q4_K = 12, ORK_GGML_Q5_K = 13,
    ORK_GGML_Q6_K = 14, ORK_GGML_Q8_K = 15, ORK_GGML_IQ2_XXS = 16, ORK_GGML_IQ2_XS = 17,
    ORK_GGML_IQ3_XXS = 18, ORK_GGML_IQ1_S = 19, ORK_GGML_IQ4_NL = 20, ORK_GGML_IQ3_S = 21,
    ORK_GGML_IQ2_S = 22, ORK_GGML_IQ4_XS = 23, ORK_GGML_I8 = 24, ORK_GGML_I16 = 25,
    ORK_GGML_I32 = 26, ORK_GGML_I64 = 27, ORK_GGML_F64 = 28, ORK_GGML_IQ1_M = 29,
    ORK_GGML_BF16 = 30, ORK_GGML_TQ1_0 = 34, ORK_GGML_TQ2_0 = 35, ORK_GGML_MXFP4 = 39,
    ORK_GGML_NVFP4 = 40, ORK_GGML_Q1_0 = 41, ORK_GGML_Q2_0 = 42,
    ORK_GGML_TYPE_COUNT = 43
};

typedef struct ork_ggml_type_info {
    const char *name;     /* gguf-py style name, e.g. "Q4_K"; NULL for an invalid id */
    uint32_t block_size;  /* elements per block */
    uint32_t type_size;   /* bytes per block */
    int is_quantized;     /* block-quantized (not a plain float/int type) */
} ork_ggml_type_info;

/* NULL if the id is out of range or removed. */
const ork_ggml_type_info *ork_ggml_type(uint32_t type_id);
/* 8 * type_size / block_size, or -1 for an invalid id */
double ork_ggml_bits_per_weight(uint32_t type_id);

#endif
