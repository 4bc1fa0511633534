"""The architecture table: everything orkpy needs to run a llama.cpp architecture, one
declarative entry (:class:`Arch`) per GGUF ``general.architecture``.

Every fact below was read from llama.cpp (the version vendored in llama-cpp-python 0.3.36:
``src/models/<arch>.cpp`` for the graph and the hyper-parameters each architecture reads,
``src/llama-model.cpp`` for the shared hyper-parameters and ``create_tensor_qkv``,
``src/llama-hparams.cpp`` for the sliding-window pattern, ``src/llama-graph.cpp`` for
``build_attn`` / ``build_ffn``), and each is checked against the live llama.cpp by
``tests/test_arch_oracle.py``.

==========  ==========================  ====  =========  ================  =================================
arch        models                      RoPE  FFN gate   norms             attention / embeddings / logits
==========  ==========================  ====  =========  ================  =================================
llama       Llama 2/3/3.2, TinyLlama,   NORM  SiLU       attn, ffn         1/sqrt(hd); optional biases on
            SmolLM2                                                        every linear; llama3 rope_freqs
qwen2       Qwen2/2.5, DeepSeek-R1-     NEOX  SiLU       attn, ffn         q/k/v biases; optional output bias
            Distill-Qwen
qwen3       Qwen3                       NEOX  SiLU       + q/k per head    1/sqrt(hd)
gemma       Gemma 2B/7B, CodeGemma      NEOX  GELU-tanh  attn, ffn         x*sqrt(n_embd); 1/sqrt(hd) (key
                                                                           length: 7B's 256 != n_embd/n_head);
                                                                           tied; no rope_freqs
gemma2      Gemma 2                     NEOX  GELU-tanh  + post-attn,      x*sqrt(n_embd); window every other
                                                         post-ffn          layer (0, 2, ...; 4096 by default);
                                                                           attn soft-cap 50, final 30; tied
gemma3      Gemma 3 (text)              NEOX  GELU-tanh  + q/k, post-attn, x*sqrt(n_embd); window on 5 of 6
                                                         post-ffn          layers, local RoPE base 10000;
                                                                           final soft-cap only if the key
phi3        Phi-3 / Phi-3.5 mini        NEOX  SiLU       attn, ffn         fused attn_qkv, fused ffn_up =
                                                                           [gate; up]; window ignored
==========  ==========================  ====  =========  ================  =================================

Common to all: RMSNorm everywhere (``attention.layer_norm_rms_epsilon``); norm weights are
used as stored (llama.cpp's converter already stores Gemma's ``1 + w`` norm weights with
the one added, so no architecture adds anything at run time); a missing ``output.weight``
means a tied head (Gemma and Gemma 2 are always tied: llama.cpp never loads an ``output.weight``
for them and refuses a file holding one, as orkpy does); ``attn_qkv`` (+ ``.bias``) may replace
``attn_q/k/v`` in any architecture (``create_tensor_qkv``). ``rope.dimension_count`` (default: the head
size) must be the head size for llama, qwen2 and qwen3; the others rotate the first ``n_rot`` dimensions
of each head, ``n_rot`` even in [2, head size] (:func:`check_n_rot`). The vocabulary
(``tokenizer.ggml.tokens``) has exactly as many tokens as the embedding table and the head have rows
(:func:`check_vocab`): llama.cpp allows no padding rows.

Gemma's attention scale: ``1/sqrt(head_dim)`` (Gemma 1 always: ``src/models/gemma.cpp`` scales Q
by ``1/sqrtf(n_embd_head)``, the head size, 256 on the 7B model where n_embd / n_head = 192;
Gemma 1 reads no window or soft-cap key), except the 27B models (46 layers for Gemma 2, 62
for Gemma 3) where it is ``1/sqrt(n_embd // n_head)`` (gemma_pytorch's
``query_pre_attn_scalar``, as llama.cpp hard-codes it).

Sliding window (llama.cpp's ``LLAMA_SWA_TYPE_STANDARD``): on a windowed layer the key at
position u is visible from t when ``t - u < n_swa``. Layer il is windowed when
``il % p < p - 1`` for the pattern p (``attention.sliding_window_pattern`` overrides p, or
gives the per-layer flags as an array). Windowed layers use ``rope.freq_base_swa`` (Gemma 2
default: the model's base; Gemma 3 default: 10000) and, for Gemma 3, RoPE scale 1.

Fused tensors are split when a source is opened (:func:`splits`), so the rest of orkpy
(tier maps, imatrix, ``quantize_model``, NPU routing, the C model's linear order) only ever
sees ``attn_q / attn_k / attn_v`` and ``ffn_gate / ffn_up``: ``attn_qkv`` rows are
``[q (n_head*hd); k (n_head_kv*hd); v (n_head_kv*hd)]`` (``build_qkv``), phi3's ``ffn_up``
rows ``[gate (n_ff); up (n_ff)]`` (``ggml_swiglu``, not swapped: the first half goes
through SiLU). A tier map made from a phi3 GGUF names the fused tensors; each split part
gets its fused tensor's tier and type (:func:`split_tier_map`).

Adding an architecture: a table entry below; and only where its arithmetic is new, a flag
in ``csrc/ork/model.h`` (``ork_model`` / ``ork_layer``) and its key in
:func:`core_hparams` / ``orkpy.runtime.model._forward_model``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from .._core import FormatError
from .tiermap import EMBEDDING, OUTPUT, TierEntry, TierMap

#: The FFN gate function (``Arch.gate_fn``, hparams ``"gate_fn"``): name -> csrc/ork/act.h ``ork_act``. Not to
#: be confused with ``act=``, the activation quantization mode of the packed linears (orkpy.runtime.actcal).
GATE_FNS = {"silu": 0, "gelu_tanh": 1}
ACTIVATIONS = GATE_FNS  # the old name
#: RoPE types: name -> llama.cpp's rope type (model.h ``ork_rope_type``)
ROPE_TYPES = {"norm": 0, "neox": 2}

#: The C model's per-block roles -> llama.cpp's GGUF tensor stems (``src/llama-arch.cpp``).
NORM_STEMS = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
              "post_attn_norm": "post_attention_norm", "post_ffn_norm": "post_ffw_norm"}
LINEAR_STEMS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
OUTPUT_NORM = "output_norm.weight"
#: RoPE frequency-factor tensors (global): llama3's ``rope_freqs``, LongRoPE's short/long factors
ROPE_FREQS, ROPE_SHORT, ROPE_LONG = "rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight"
QKV = ("attn_qkv", ("attn_q", "attn_k", "attn_v"))  # fused in any architecture (create_tensor_qkv)
GATE_UP = ("ffn_up", ("ffn_gate", "ffn_up"))        # phi3: one ffn_up of 2 * n_ff rows, gate first

#: The metadata keys read (``<arch>.`` + suffix): hparams field -> key suffix
HPARAM_KEYS = {
    "n_layer": "block_count", "n_embd": "embedding_length", "n_ff": "feed_forward_length",
    "n_head": "attention.head_count", "n_head_kv": "attention.head_count_kv", "head_dim": "attention.key_length",
    "head_dim_v": "attention.value_length", "n_rot": "rope.dimension_count", "rope_base": "rope.freq_base",
    "norm_eps": "attention.layer_norm_rms_epsilon", "n_ctx_train": "context_length",
    "rope_scaling": "rope.scaling.type", "rope_factor": "rope.scaling.factor",
    "rope_factor_old": "rope.scale_linear", "rope_attn_factor": "rope.scaling.attn_factor",
    "n_ctx_orig": "rope.scaling.original_context_length", "n_swa": "attention.sliding_window",
    "swa_pattern": "attention.sliding_window_pattern", "rope_base_swa": "rope.freq_base_swa",
    "attn_softcap": "attn_logit_softcapping", "final_softcap": "final_logit_softcapping",
}


@dataclass(frozen=True)
class Arch:
    """One architecture (see the module doc for the facts behind each field)."""

    name: str
    models: str
    rope: str = "norm"                      # "norm" | "neox"
    gate_fn: str = "silu"                   # the FFN gate function: "silu" | "gelu_tanh" (GATE_FNS)
    qk_norm: bool = False                   # attn_q_norm / attn_k_norm, RMS per head (required)
    post_norms: bool = False                # post_attention_norm / post_ffw_norm (required)
    norm_plus_one: bool = False             # the converter stored 1 + w (informational: used as stored)
    embd_scale: str = "none"                # "none" | "sqrt_n_embd"
    attn_scale: str = "head_dim"            # "head_dim" | "gemma" (1/sqrt(n_embd//n_head) at big_layers)
    big_layers: int = 0                     # gemma: the 27B model's layer count
    attn_softcap: Optional[float] = None    # default when the key is absent; None: never (key not read)
    final_softcap: Optional[float] = None   # default when the key is absent (0: off); None: never
    swa: str = "none"                       # "none" | "standard" | "ignored" (key read, llama.cpp disables it)
    swa_pattern: int = 0                    # default pattern p: layer il windowed when il % p < p - 1
    swa_default: int = 0                    # window when the key is absent (0: no window without the key)
    swa_rope_base: Optional[float] = None   # windowed layers' RoPE base default; None: the model's
    swa_rope_scale: Optional[float] = None  # windowed layers' RoPE scale; None: the model's
    biases: Tuple[str, ...] = ("attn_q", "attn_k", "attn_v")  # linears that may carry a .bias
    output_bias: bool = False               # output.bias may be present
    always_tied: bool = False               # the head is always token_embd (an output.weight is refused)
    full_rope: bool = False                 # rope.dimension_count must be the head size (llama.cpp refuses
                                            # or asserts otherwise); else an even value in [2, head size]
    fused: Tuple[Tuple[str, Tuple[str, ...]], ...] = (QKV,)   # fused tensors split at load
    rope_factors: bool = True               # rope_freqs / rope_factors_short/long may be present

    @property
    def norms(self) -> Tuple[str, ...]:
        """The block-norm roles this architecture requires, in the C layer's keys."""
        return (("attn_norm", "ffn_norm") + (("q_norm", "k_norm") if self.qk_norm else ())
                + (("post_attn_norm", "post_ffn_norm") if self.post_norms else ()))


ARCHS: Dict[str, Arch] = {a.name: a for a in (
    Arch("llama", "Llama 2/3/3.2, TinyLlama, SmolLM2", rope="norm",
         biases=("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"), full_rope=True),
    Arch("qwen2", "Qwen2, Qwen2.5, DeepSeek-R1-Distill-Qwen", rope="neox", output_bias=True, full_rope=True),
    Arch("qwen3", "Qwen3", rope="neox", qk_norm=True, full_rope=True),
    Arch("gemma", "Gemma 2B/7B, CodeGemma", rope="neox", gate_fn="gelu_tanh", norm_plus_one=True,
         embd_scale="sqrt_n_embd", always_tied=True, rope_factors=False),
    Arch("gemma2", "Gemma 2", rope="neox", gate_fn="gelu_tanh", post_norms=True, norm_plus_one=True,
         embd_scale="sqrt_n_embd", attn_scale="gemma", big_layers=46, attn_softcap=50.0, final_softcap=30.0,
         swa="standard", swa_pattern=2, swa_default=4096, always_tied=True),
    Arch("gemma3", "Gemma 3 (text)", rope="neox", gate_fn="gelu_tanh", qk_norm=True, post_norms=True,
         norm_plus_one=True, embd_scale="sqrt_n_embd", attn_scale="gemma", big_layers=62, final_softcap=0.0,
         swa="standard", swa_pattern=6, swa_rope_base=10000.0, swa_rope_scale=1.0),
    Arch("phi3", "Phi-3, Phi-3.5 mini", rope="neox", swa="ignored", fused=(QKV, GATE_UP)),
)}

SUPPORTED = tuple(ARCHS)


def get(name: Any, where: str = "") -> Arch:
    """The table entry of architecture ``name``; ValueError listing the supported ones."""
    if name not in ARCHS:
        raise ValueError(f"{where + ': ' if where else ''}architecture {name!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED)})")
    return ARCHS[name]


# --------------------------------------------------------------- hparams --

def attention_scale(a: Arch, n_layer: int, n_embd: int, n_head: int, head_dim: int) -> float:
    """The attention score scale, computed in float32 as llama.cpp does (1.0f / sqrtf(d))."""
    d = n_embd // n_head if (a.attn_scale == "gemma" and n_layer == a.big_layers) else head_dim
    return float(np.float32(1.0) / np.sqrt(np.float32(d)))


def swa_layers(n_layer: int, pattern: Any) -> List[int]:
    """The windowed layers for a pattern: an int p (il % p < p - 1; 0: every layer) or per-layer flags."""
    if isinstance(pattern, (list, tuple, np.ndarray)):
        flags = [bool(x) for x in pattern]
        return [i for i in range(n_layer) if i < len(flags) and flags[i]]
    p = int(pattern)
    return [i for i in range(n_layer) if p == 0 or i % p < p - 1]


def _finite32(x: float) -> bool:
    """x is finite once rounded to float32 (the C model's hyper-parameters)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.float32(x)))


# an orkpy model directory's float.gguf without token_embd.weight (its tied embedding table is read from the packed
# head, quantize_model(tied_lookup="packed")) records the vocabulary size under this key
PACKED_LOOKUP_KEY = "orkpy.packed_lookup.n_vocab"


def hparams(md: Mapping[str, Any], shapes: Mapping[str, Tuple[int, ...]], where: str) -> Dict[str, Any]:
    """The forward pass's hyper-parameters from a GGUF's metadata ``md`` and tensor shapes
    (``where`` names the file in errors): ValueError for an unsupported architecture, a missing
    key or tensor, or a tensor the architecture does not use; NotImplementedError for a
    feature orkpy does not run (YaRN, per-layer head counts, ...)."""
    name = md.get("general.architecture")
    a = get(name, where)

    def key(field: str) -> str:
        return f"{name}.{HPARAM_KEYS[field]}"

    def req(field: str, default: Any = None) -> Any:
        v = md.get(key(field), default)
        if v is None:
            raise ValueError(f"{where}: metadata key '{key(field)}' is missing")
        if isinstance(v, (list, tuple, np.ndarray)):
            raise NotImplementedError(f"{where}: '{key(field)}' is an array (per-layer values): not implemented")
        return v

    def real(k: str, v: Any) -> float:
        """A float hyper-parameter read from key k: finite as a float32 (the C model's type), else a
        ValueError naming the file, the key and the value."""
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: metadata key '{k}' = {v!r} is not a number") from None
        if not _finite32(x):
            raise ValueError(f"{where}: metadata key '{k}' = {x!r} is not a finite float32")
        return x

    def freal(field: str, default: Any = None) -> float:
        return real(key(field), req(field, default))

    n_layer, n_embd, n_head = int(req("n_layer")), int(req("n_embd")), int(req("n_head"))
    if n_head <= 0:
        raise ValueError(f"{where}: '{key('n_head')}' = {n_head}")
    head_dim = int(req("head_dim", n_embd // n_head))
    if int(req("head_dim_v", head_dim)) != head_dim:
        raise NotImplementedError(f"{where}: key and value head sizes differ ({head_dim} vs "
                                  f"{md.get(key('head_dim_v'))}): not implemented")
    n_ff = int(req("n_ff"))
    n_rot = int(req("n_rot", head_dim))
    check_n_rot(a, n_rot, head_dim, where, key("n_rot"))
    n_ctx_train = int(req("n_ctx_train", 0))

    # RoPE scaling (llama-model.cpp: type "linear" unless given; factor -> freq_scale = 1/factor)
    scaling = md.get(key("rope_scaling"), "linear")
    if scaling == "none":
        freq_scale = 1.0
    elif scaling in ("linear", "longrope"):
        fkey = key("rope_factor") if key("rope_factor") in md else key("rope_factor_old")
        factor = real(fkey, md.get(fkey, 0.0))
        freq_scale = 1.0 / factor if factor else 1.0
        if not _finite32(freq_scale):
            raise ValueError(f"{where}: metadata key '{fkey}' = {factor!r} gives the RoPE frequency scale "
                             f"1/{factor!r}, which is not a finite float32")
    else:
        raise NotImplementedError(f"{where}: RoPE scaling type {scaling!r} is not implemented (none, linear, longrope)")

    if EMBEDDING in shapes:
        n_vocab = int(shapes[EMBEDDING][0])
    elif isinstance(md.get(PACKED_LOOKUP_KEY), int) and md[PACKED_LOOKUP_KEY] > 0:
        n_vocab = int(md[PACKED_LOOKUP_KEY])  # an orkpy model directory whose tied table is stored once, packed
    else:
        raise ValueError(f"{where}: no tensor {EMBEDDING!r}")
    check_vocab(md, shapes, n_vocab, where)
    hp: Dict[str, Any] = {
        "arch": name,
        "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head,
        "n_head_kv": int(req("n_head_kv", n_head)), "head_dim": head_dim, "n_ff": n_ff,
        "n_vocab": n_vocab, "n_rot": n_rot, "rope_type": ROPE_TYPES[a.rope],
        "rope_base": freal("rope_base", 10000.0), "rope_freq_scale": freq_scale,
        "norm_eps": freal("norm_eps"), "n_ctx_train": n_ctx_train,
        "gate_fn": a.gate_fn,
        "embd_scale": 0.0,
        "attn_scale": attention_scale(a, n_layer, n_embd, n_head, head_dim),
        "attn_softcap": 0.0, "final_softcap": 0.0, "rope_attn_factor": 1.0,
        "n_swa": 0, "swa_layers": [], "rope_base_swa": 0.0, "rope_freq_scale_swa": 0.0,
        "rope_factors": None, "n_ctx_max": 0, "biases": [],
    }
    if a.embd_scale == "sqrt_n_embd":  # ggml_scale(x, sqrtf(n_embd)): sqrtf of the float
        hp["embd_scale"] = float(np.sqrt(np.float32(n_embd)))
    if a.attn_softcap is not None:
        hp["attn_softcap"] = real(key("attn_softcap"), md.get(key("attn_softcap"), a.attn_softcap))
    if a.final_softcap is not None:
        hp["final_softcap"] = real(key("final_softcap"), md.get(key("final_softcap"), a.final_softcap))
    if a.swa == "standard":
        n_swa = int(md.get(key("n_swa"), a.swa_default) or 0)
        if n_swa > 0:
            hp["n_swa"] = n_swa
            hp["swa_layers"] = swa_layers(n_layer, md.get(key("swa_pattern"), a.swa_pattern))
            base = a.swa_rope_base if a.swa_rope_base is not None else hp["rope_base"]
            hp["rope_base_swa"] = real(key("rope_base_swa"), md.get(key("rope_base_swa"), base))
            hp["rope_freq_scale_swa"] = a.swa_rope_scale if a.swa_rope_scale is not None else freq_scale
    if a.rope_factors:
        if ROPE_FREQS in shapes:
            hp["rope_factors"] = ROPE_FREQS
        elif ROPE_SHORT in shapes or ROPE_LONG in shapes:
            # llama.cpp takes the long factors when the context exceeds the original one; orkpy
            # runs the short ones and refuses longer chunks
            if ROPE_SHORT not in shapes:
                raise NotImplementedError(f"{where}: {ROPE_LONG} without {ROPE_SHORT}: not implemented")
            hp["rope_factors"] = ROPE_SHORT
            hp["n_ctx_max"] = int(md.get(key("n_ctx_orig"), n_ctx_train) or 0)
        if hp["rope_factors"] is not None and tuple(shapes[hp["rope_factors"]]) != (n_rot // 2,):
            raise ValueError(f"{where}: {hp['rope_factors']} has shape {shapes[hp['rope_factors']]}, "
                             f"expected ({n_rot // 2},)")
    hp["rope_attn_factor"] = real(key("rope_attn_factor"), md.get(key("rope_attn_factor"), 1.0))
    _check_tensors(a, hp, shapes, where)
    return hp


def check_n_rot(a: Arch, n_rot: int, head_dim: int, where: str, key: str) -> None:
    """FormatError naming the file and the key for a ``rope.dimension_count`` llama.cpp does not run:
    llama refuses any value but the head size when it loads the file ("invalid n_rot"), qwen2 and qwen3
    assert it in their graphs (an abort); for the others its RoPE kernel asserts an even value at most
    the head size, and 0 makes it loop for ever (ggml-cpu ops.cpp: ``i0 += n_dims - 2``). A partial
    rotation (an even value below the head size: the first ``n_rot`` dimensions of each head rotate)
    runs in both and gives the same logits (tests/test_arch_oracle.py)."""
    if a.full_rope:
        if n_rot != head_dim:
            raise FormatError(f"{where}: '{key}' = {n_rot}: architecture {a.name!r} rotates whole heads, expected "
                              f"the head size {head_dim} (llama.cpp refuses the file: invalid n_rot)")
    elif not (0 < n_rot <= head_dim and n_rot % 2 == 0):
        raise FormatError(f"{where}: '{key}' = {n_rot}: expected an even number of dimensions in [2, {head_dim}] "
                          f"(the head size; llama.cpp cannot run this value)")


def check_vocab(md: Mapping[str, Any], shapes: Mapping[str, Tuple[int, ...]], n_vocab: int, where: str) -> None:
    """FormatError naming the file when the vocabulary (``tokenizer.ggml.tokens``) and the embedding
    table / output head / output bias do not have one row per token. llama.cpp creates these
    tensors with ``vocab.n_tokens()`` rows and refuses any other shape ("tensor 'token_embd.weight'
    has wrong shape"): it allows no padding rows beyond the vocabulary, nor a vocabulary larger than
    the table, so orkpy refuses both, and every id the tokenizer or ``generate`` can produce then has
    an embedding row and a logit. A file without ``tokenizer.ggml.tokens`` (no tokenizer: token ids
    only) is sized by its embedding table."""
    tokens = md.get("tokenizer.ggml.tokens")
    if isinstance(tokens, (list, tuple)) and len(tokens) != n_vocab:
        what = f"tensor {EMBEDDING!r} has {n_vocab} rows" if EMBEDDING in shapes else \
            f"'{PACKED_LOOKUP_KEY}' is {n_vocab}"
        raise FormatError(f"{where}: the vocabulary ('tokenizer.ggml.tokens') has {len(tokens)} tokens but {what}: "
                          "one per token is required (llama.cpp refuses the file: wrong shape)")
    for t in (OUTPUT, "output.bias"):
        if t in shapes and int(shapes[t][0]) != n_vocab:
            raise FormatError(f"{where}: tensor {t!r} has {shapes[t][0]} rows, expected {n_vocab} (one per "
                              "token)")


def _check_tensors(a: Arch, hp: Dict[str, Any], shapes: Mapping[str, Tuple[int, ...]], where: str) -> None:
    """Required norms present in every block; biases all-or-none per linear; no tensor the
    architecture does not use (llama.cpp refuses such a file); sets hp["biases"]."""
    n_layer = hp["n_layer"]
    fused_stems = {f for f, _ in a.fused}
    block_ok = ({NORM_STEMS[r] for r in a.norms} | set(LINEAR_STEMS) | fused_stems)
    weights = {f"{s}.weight" for s in block_ok}
    bias_stems = set(a.biases) | ({"attn_qkv"} if ("attn_q" in a.biases and QKV in a.fused) else set())
    allowed_block = weights | {f"{s}.bias" for s in bias_stems}
    allowed_top = {EMBEDDING, OUTPUT_NORM} | ({OUTPUT} if not a.always_tied else set())
    if a.output_bias:
        allowed_top.add("output.bias")
    if a.rope_factors:
        allowed_top |= {ROPE_FREQS, ROPE_SHORT, ROPE_LONG}
    for n in shapes:
        parts = n.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < n_layer:
            ok = parts[2] in allowed_block
        else:
            ok = n in allowed_top
        if not ok:
            raise ValueError(f"{where}: tensor {n!r} is not used by architecture {a.name!r} (llama.cpp would "
                             "refuse the file)")
    if OUTPUT_NORM not in shapes:
        raise ValueError(f"{where}: no tensor {OUTPUT_NORM!r}")
    for i in range(n_layer):
        for r in a.norms:
            t = f"blk.{i}.{NORM_STEMS[r]}.weight"
            if t not in shapes:
                raise ValueError(f"{where}: architecture {a.name!r} needs tensor {t!r}, which is missing")
    biases = []
    for stem in LINEAR_STEMS:
        have = [f"blk.{i}.{stem}.bias" in shapes or (stem in QKV[1] and f"blk.{i}.attn_qkv.bias" in shapes)
                for i in range(n_layer)]
        if any(have) and not all(have):
            raise ValueError(f"{where}: {stem} has a bias in some blocks only (block {have.index(not have[0])})")
        if all(have) and n_layer:
            biases.append(stem)
    if "output.bias" in shapes:
        biases.append("output")
    hp["biases"] = biases


def core_hparams(hp: Mapping[str, Any]) -> Dict[str, Any]:
    """The scalar hyper-parameters ``_core.ForwardModel`` takes (model.h's fields; features
    absent from ``hp`` take the architecture's defaults, i.e. off)."""
    a = get(hp["arch"])
    out = {k: hp[k] for k in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab", "n_rot",
                              "rope_type", "rope_base", "rope_freq_scale", "norm_eps")}
    out["gate_fn"] = GATE_FNS[hp.get("gate_fn", a.gate_fn)]
    for k in ("embd_scale", "attn_scale", "attn_softcap", "final_softcap", "rope_attn_factor"):
        out[k] = float(hp.get(k, 0.0))
    out["n_ctx_max"] = int(hp.get("n_ctx_max", 0))
    return out


def layer_settings(hp: Mapping[str, Any], i: int) -> Dict[str, Any]:
    """Layer ``i``'s sliding window and RoPE base / scale for the C layer (empty: the model's)."""
    if i not in hp.get("swa_layers", ()):
        return {}
    return {"n_swa": int(hp["n_swa"]), "rope_base": float(hp["rope_base_swa"]),
            "rope_freq_scale": float(hp["rope_freq_scale_swa"])}


# ---------------------------------------------------------------- splits --

def part_rows(hp: Mapping[str, Any], fused: str) -> Optional[Dict[str, Tuple[int, int]]]:
    """{part stem: (row0, row1)} of a fused stem's rows (None for a stem that is not fused)."""
    if fused == QKV[0]:
        qd, kvd = hp["n_head"] * hp["head_dim"], hp["n_head_kv"] * hp["head_dim"]
        return {"attn_q": (0, qd), "attn_k": (qd, qd + kvd), "attn_v": (qd + kvd, qd + 2 * kvd)}
    if fused == GATE_UP[0]:
        return {"ffn_gate": (0, hp["n_ff"]), "ffn_up": (hp["n_ff"], 2 * hp["n_ff"])}
    return None


def splits(hp: Mapping[str, Any], shapes: Mapping[str, Tuple[int, ...]]) -> Dict[str, Tuple[str, int, int]]:
    """{split tensor name: (fused tensor name, row0, row1)} for the fused tensors a file holds
    (weights and biases). A fused tensor is recognised by its rows: phi3's ``ffn_up`` of
    ``2 * n_ff`` rows (a file already split, e.g. a model directory's float part, has
    ``n_ff``); ``attn_qkv`` always. ValueError when the rows do not add up."""
    a = get(hp["arch"])
    out: Dict[str, Tuple[str, int, int]] = {}
    for i in range(hp["n_layer"]):
        for fused, parts in a.fused:
            rows = part_rows(hp, fused)
            assert rows is not None
            total = max(r1 for _, r1 in rows.values())
            for kind in ("weight", "bias"):
                name = f"blk.{i}.{fused}.{kind}"
                if name not in shapes:
                    continue
                n = shapes[name][0]
                if fused == GATE_UP[0] and n != total:
                    if kind == "weight" and n == hp["n_ff"]:
                        continue  # an ordinary ffn_up (already split)
                    raise ValueError(f"{name} has {n} rows, expected {total} (fused gate + up) or {hp['n_ff']}")
                if n != total:
                    raise ValueError(f"{name} has {n} rows, expected {total} = {' + '.join(parts)}")
                for p in parts:
                    out[f"blk.{i}.{p}.{kind}"] = (name, *rows[p])
    return out


def split_shapes(shapes: Mapping[str, Tuple[int, ...]],
                 plan: Mapping[str, Tuple[str, int, int]]) -> Dict[str, Tuple[int, ...]]:
    """``shapes`` with every fused tensor of ``plan`` replaced by its parts."""
    fused = {f for f, _, _ in plan.values()}
    out = {n: tuple(s) for n, s in shapes.items() if n not in fused}
    for n, (f, r0, r1) in plan.items():
        out[n] = (r1 - r0, *tuple(shapes[f])[1:])
    return out


def split_tier_map(tm: TierMap, hp: Mapping[str, Any]) -> TierMap:
    """``tm`` with each entry for a fused tensor (a tier map made from e.g. a phi3 GGUF)
    replaced by entries for its parts: same tier and ggml type, the parts' shapes. A map
    without fused entries is returned as is."""
    shapes = {n: e.shape for n, e in tm.entries.items()}
    plan = splits(hp, shapes)
    if not plan:
        return tm
    fused = {f for f, _, _ in plan.values()}
    entries: Dict[str, TierEntry] = {}
    for n, e in tm.entries.items():
        if n not in fused:
            entries[n] = e
            continue
        for part, (f, r0, r1) in plan.items():
            if f == n:
                entries[part] = TierEntry(e.tier, e.ggml_type, (r1 - r0, *e.shape[1:]))
    return TierMap(entries, tm.threshold, tm.source, tm.tied)


def table_rows() -> List[Dict[str, Any]]:
    """The table as rows of plain values (for docs and reports)."""
    rows = []
    for a in ARCHS.values():
        rows.append({"arch": a.name, "models": a.models, "rope": a.rope, "gate_fn": a.gate_fn, "norms": list(a.norms),
                     "biases": list(a.biases) + (["output"] if a.output_bias else []),
                     "fused": {f: list(p) for f, p in a.fused}, "embd_scale": a.embd_scale,
                     "attn_scale": a.attn_scale, "attn_softcap": a.attn_softcap, "final_softcap": a.final_softcap,
                     "swa": a.swa, "swa_pattern": a.swa_pattern, "tied": "always" if a.always_tied else "optional"})
    return rows


__all__ = ["ACTIVATIONS", "ARCHS", "Arch", "GATE_FNS", "HPARAM_KEYS", "LINEAR_STEMS", "NORM_STEMS", "ROPE_TYPES", "SUPPORTED",
           "attention_scale", "check_n_rot", "check_vocab", "core_hparams", "get", "hparams", "layer_settings",
           "part_rows", "split_shapes", "split_tier_map", "splits", "swa_layers", "table_rows"]
