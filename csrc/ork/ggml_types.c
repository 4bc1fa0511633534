#include "ggml_types.h"

static const ork_ggml_type_info ggml_types[ORK_GGML_TYPE_COUNT] = {
    [ORK_GGML_F32] = {"F32", 1, 4, 0},
    [ORK_GGML_F16] = {"F16", 1, 2, 0},
    [ORK_GGML_Q4_0] = {"Q4_0", 32, 18, 1},
    [ORK_GGML_Q4_1] = {"Q4_1", 32, 20, 1},
    [ORK_GGML_Q5_0] = {"Q5_0", 32, 22, 1},
    [ORK_GGML_Q5_1] = {"Q5_1", 32, 24, 1},
    [ORK_GGML_Q8_0] = {"Q8_0", 32, 34, 1},
    [ORK_GGML_Q8_1] = {"Q8_1", 32, 36, 1},
    [ORK_GGML_Q2_K] = {"Q2_K", 256, 84, 1},
    [ORK_GGML_Q3_K] = {"Q3_K", 256, 110, 1},
    [ORK_GGML_Q4_K] = {"Q4_K", 256, 144, 1},
    [ORK_GGML_Q5_K] = {"Q5_K", 256, 176, 1},
    [ORK_GGML_Q6_K] = {"Q6_K", 256, 210, 1},
    [ORK_GGML_Q8_K] = {"Q8_K", 256, 292, 1},
    [ORK_GGML_IQ2_XXS] = {"IQ2_XXS", 256, 66, 1},
    [ORK_GGML_IQ2_XS] = {"IQ2_XS", 256, 74, 1},
    [ORK_GGML_IQ3_XXS] = {"IQ3_XXS", 256, 98, 1},
    [ORK_GGML_IQ1_S] = {"IQ1_S", 256, 50, 1},
    [ORK_GGML_IQ4_NL] = {"IQ4_NL", 32, 18, 1},
    [ORK_GGML_IQ3_S] = {"IQ3_S", 256, 110, 1},
    [ORK_GGML_IQ2_S] = {"IQ2_S", 256, 82, 1},
    [ORK_GGML_IQ4_XS] = {"IQ4_XS", 256, 136, 1},
    [ORK_GGML_I8] = {"I8", 1, 1, 0},
    [ORK_GGML_I16] = {"I16", 1, 2, 0},
    [ORK_GGML_I32] = {"I32", 1, 4, 0},
    [ORK_GGML_I64] = {"I64", 1, 8, 0},
    [ORK_GGML_F64] = {"F64", 1, 8, 0},
    [ORK_GGML_IQ1_M] = {"IQ1_M", 256, 56, 1},
    [ORK_GGML_BF16] = {"BF16", 1, 2, 0},
    [ORK_GGML_TQ1_0] = {"TQ1_0", 256, 54, 1},
    [ORK_GGML_TQ2_0] = {"TQ2_0", 256, 66, 1},
    [ORK_GGML_MXFP4] = {"MXFP4", 32, 17, 1},
    [ORK_GGML_NVFP4] = {"NVFP4", 64, 36, 1},
    [ORK_GGML_Q1_0] = {"Q1_0", 128, 18, 1},
    [ORK_GGML_Q2_0] = {"Q2_0", 64, 18, 1},
};

const ork_ggml_type_info *ork_ggml_type(uint32_t type_id) {
    if (type_id >= ORK_GGML_TYPE_COUNT || !ggml_types[type_id].name) return 0;
    return &ggml_types[type_id];
}

double ork_ggml_bits_per_weight(uint32_t type_id) {
    const ork_ggml_type_info *t = ork_ggml_type(type_id);
    return t ? 8.0 * (double)t->type_size / (double)t->block_size : -1.0;
}
