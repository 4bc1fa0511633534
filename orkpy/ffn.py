"""The NPU's fused int8 SwiGLU chain as a weight/activation path of the
forward pass, its ablations, the prep pass and the per-layer "sprinkle".
The arithmetic contract is csrc/ork/ffn_chain.h.

    model = orkpy.load_model("m.gguf", weights="int8")     # gate/up/down must be packed
    stats = prep(model, calib_tokens, n_ctx=256)            # gmax, max|silu|, ... per layer
    configure(model, stats, "fused")                        # every layer on the fused chain
    configure(model, stats, sprinkle(stats, "auto"))        # exact fp32 SiLU on the high-gmax layers

Modes: ``baseline`` (per-op w8a8, float SiLU: the chain is off), ``fused``,
``exact_silu``, ``fp32_silu_out``, ``exact_lut_input``, ``clip_pct_<P>``,
``asym_zero_point``, ``per_channel_out``, ``unfused``.

The activation is the model's (``model.hparams["act"]``, :mod:`orkpy.arch`): SiLU for
llama / qwen2 / qwen3 / phi3, GELU-tanh for gemma2 / gemma3 (GeGLU). The C model
hands it to the chain, so the LUT, the exact path and the prep statistics are of that
activation; "silu" in the mode and statistic names stands for it. Nothing else changes
for GELU: the LUT still spans the layer's gate range [-gmax, gmax] in 1024 entries and
the output scale is set by max|act| (for GELU, as for SiLU, reached at +gmax). What differs
is the negative side: GELU's lobe is shallower (minimum -0.170 at z = -0.75, SiLU -0.278)
and gone by z = -4 (|gelu| < 1e-4; SiLU's tail is -0.07 at z = -4), so with one int8 scale
of about gmax / 110 the whole lobe gets 0.17 * 110 / gmax levels: 3 at gmax 6, less than 1
(0 or -1) on a layer with gmax 32 (Gemma-3-270M's first); ``asym_zero_point`` spends levels
on it. Measured on Gemma-3-270M: bench/real_quant.py.

Scales from the prep pass (per layer): LUT step ``gmax / 511``; SiLU output
``s_scale = 1.15 * max|silu| / 127`` (clip_pct_P: the P-th percentile of
|silu| / 127, values above it clip); up ``u_scale = max|u| / 127``; product
``p_scale = max|silu * u| / 127``; asym_zero_point ``(smax - smin) / 255`` with
its zero point; per_channel_out ``1.15 * max|silu|[n] / 127``.

Sprinkle: the layers whose gate range is largest run ``exact_silu`` and the
rest ``fused``. Selection by a fixed gmax threshold, the top-K layers by
gmax, or ``auto``: ``gmax > median + c * MAD`` over the model's layers with
``c = AUTO_C = 1.0``. Measured on stories260K (bench/ffn_sweep.py, 200 chunks):
gmax per layer 5.11, 5.21, 4.58, 6.66, 6.35; c = 1 selects layers 3 and 4 (the
two largest), which cuts the fused chain's KL vs F32 from 0.0329 to 0.0247;
any c >= 2.3 selects nothing on this model. One small model is a thin basis:
Qwen3-1.7B's 7/13/19-of-28 results suggest c around 1 there too, but that was
not measured here. Ties keep the lower layer index; the choice is
deterministic (pure function of the prep statistics).
"""
import math

import numpy as np

from . import _core

#: "baseline" (the chain off) and the chain's modes from the C table (csrc/ork/ffn_chain.h)
MODES = ("baseline",) + _core.ffn_modes()
AUTO_C = 1.0
MARGIN = 1.15


def prep(model, tokens, n_ctx=256, chunks=None, threads=None):
    """Run the per-op model over calibration tokens and return per-layer FFN
    statistics (gmax = max|gate| for free, max|silu|, max|up|, ...)."""
    tokens = model.tokens(tokens)
    _, chunk_iter = model.chunks(tokens, n_ctx, None if chunks is None else int(chunks))
    return model.collect_ffn_stats(chunk_iter, threads)


def silu_percentile(stat, pct):
    """Upper edge of the histogram bin holding the pct-th percentile of |silu|."""
    edges = _core.ffn_hist_edges()
    c = np.cumsum(stat["hist"])
    k = int(np.searchsorted(c, c[-1] * pct / 100.0))
    return float(edges[min(k + 1, len(edges) - 1)])


def layer_params(stat, mode):
    """Chain settings of one layer for a mode (see the module doc)."""
    smax_abs = max(abs(stat["smin"]), stat["smax"])
    p = {"mode": mode, "lut_step": stat["gmax"] / 511.0, "s_scale": MARGIN * smax_abs / 127.0,
         "u_scale": stat["umax"] / 127.0, "p_scale": stat["pmax"] / 127.0}
    if mode.startswith("clip_pct_"):
        pct = float(mode[len("clip_pct_"):])
        if not 0 < pct < 100:
            raise ValueError(f"clip percentile must be in (0, 100), got {pct}")
        p["mode"] = "fused"
        p["s_scale"] = silu_percentile(stat, pct) / 127.0
    elif mode == "asym_zero_point":
        s = (stat["smax"] - stat["smin"]) / 255.0
        p["s_scale"] = s
        p["zp"] = int(-128 - math.floor(stat["smin"] / s + 0.5) if stat["smin"] / s >= 0 else
                      -128 - math.ceil(stat["smin"] / s - 0.5))
    elif mode == "per_channel_out":
        p["s_scale_ch"] = np.maximum(stat["s_absmax_ch"] * MARGIN / 127.0, 1e-12).astype(np.float32)
    elif mode not in MODES:
        raise ValueError(f"unknown FFN mode {mode!r} (expected one of {', '.join(MODES)} or clip_pct_<P>)")
    return p


def sprinkle(stats, select="auto", c=AUTO_C):
    """Per-layer modes: 'exact_silu' on the selected layers, 'fused' elsewhere.
    select: "auto" (median + c * MAD of gmax), an int K (top-K by gmax), a float
    threshold on gmax, or an explicit list of layer indices."""
    g = np.array([s["gmax"] for s in stats])
    if isinstance(select, str) and select == "auto":
        med = float(np.median(g))
        mad = float(np.median(np.abs(g - med)))
        exact = [i for i in range(len(g)) if g[i] > med + c * mad]
    elif isinstance(select, (int, np.integer)) and not isinstance(select, bool):
        order = sorted(range(len(g)), key=lambda i: (-g[i], i))
        exact = sorted(order[: int(select)])
    elif isinstance(select, float):
        exact = [i for i in range(len(g)) if g[i] > select]
    elif isinstance(select, (list, tuple)):
        exact = sorted(int(i) for i in select)
    else:
        raise ValueError(f"bad sprinkle selection {select!r}")
    return ["exact_silu" if i in exact else "fused" for i in range(len(g))]


def configure(model, stats, modes):
    """Set every layer's FFN mode: one mode name for all layers or a list per layer."""
    n = model.hparams["n_layer"]
    if isinstance(modes, str):
        modes = [modes] * n
    if len(modes) != n:
        raise ValueError(f"{len(modes)} modes for {n} layers")
    for i, mode in enumerate(modes):
        model.set_ffn(i, None if mode == "baseline" else layer_params(stats[i], mode))
    return modes


SWEEP_CLIPS = (99.9, 99.5, 99.0)


def sweep(model_path, text, calib_text, n_ctx=256, chunks=None, calib_chunks=None, threads=None, progress=False,
          log=None, meta=None):
    """Every configuration of the issue's sweep; rows of dict(mode, exact_layers, ppl, ppl_err, kl, wall_s).
    ``meta``: a safetensors source's GGUF for hyper-parameters and tokenizer (:func:`orkpy.load_model`)."""
    import os
    import tempfile
    import time

    from .model import load_model
    from .ppl import perplexity

    log = log or (lambda m: None)
    with tempfile.TemporaryDirectory(prefix="orkpy-ffn-") as work:  # the reference log-probs, removed after
        ref_lp = os.path.join(work, "ref.npz")
        ref = load_model(model_path, weights="gguf", meta=meta)
        tokens = ref.tokens(text)  # tokenized once: every configuration scores these ids
        perplexity(ref, tokens, n_ctx=n_ctx, chunks=chunks, threads=threads, progress=progress, save_logprobs=ref_lp)
        del ref
        m = load_model(model_path, weights="int8", meta=meta)
        stats = prep(m, m.tokenizer.encode(calib_text), n_ctx=n_ctx, chunks=calib_chunks, threads=threads)
        n = m.hparams["n_layer"]
        rows = []

        def run(label, modes):
            t0 = time.perf_counter()
            modes = configure(m, stats, modes)
            r = perplexity(m, tokens, n_ctx=n_ctx, chunks=chunks, threads=threads, progress=progress,
                           kld_base=ref_lp)
            exact = [i for i, md in enumerate(modes) if md in ("exact_silu", "baseline")]
            rows.append({"mode": label, "exact_layers": exact, "ppl": r.ppl, "ppl_err": r.ppl_err,
                         "kl": r.kld["mean"], "wall_s": time.perf_counter() - t0})
            log(f"{label:<18} exact {str(exact):<20} PPL {r.ppl:.4f} KL {r.kld['mean']:.6f}")

        for mode in ("baseline", "fused", "exact_silu", "fp32_silu_out", "exact_lut_input"):
            run(mode, mode)
        for pct in SWEEP_CLIPS:
            run(f"clip_pct_{pct:g}", f"clip_pct_{pct:g}")
        for mode in ("asym_zero_point", "per_channel_out", "unfused"):
            run(mode, mode)
        for k in range(n + 1):
            run("sprinkle", sprinkle(stats, k))
        run("sprinkle_auto", sprinkle(stats, "auto"))
        return rows, stats
