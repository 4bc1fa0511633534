/* act.h - the FFN gate activations of the supported architectures, one
 * definition for the per-op forward pass (model.c) and the fused FFN chain's
 * lookup tables (ffn_chain.c).
 *
 *   ORK_ACT_SILU       silu(z) = z / (1 + exp(-z))                  (the gate_fn of most rows of orkpy/formats/arch.py)
 *   ORK_ACT_GELU_TANH  gelu(z) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))   (the Gemma family)
 *
 * FFN output = act(x Wg^T) * (x Wu^T), then Wd. Float32 arithmetic, libm expf/tanhf.
 */
#ifndef ORK_ACT_H
#define ORK_ACT_H

#include <math.h>

typedef enum { ORK_ACT_SILU = 0, ORK_ACT_GELU_TANH = 1 } ork_act;
#define ORK_ACT_COUNT 2

static inline float ork_act_apply(ork_act act, float z) {
    if (act == ORK_ACT_GELU_TANH) {
        const float c = 0.7978845608028654f; /* sqrt(2/pi) */
        return 0.5f * z * (1.0f + tanhf(c * (z + 0.044715f * z * z * z)));
    }
    return z / (1.0f + expf(-z));
}

#endif
