"""The NPU's fused int8 SwiGLU chain as a weight/activation path of the
forward pass, its ablations, the prep pass and the per-layer "sprinkle".
The arithmetic contract is csrc/ork/ffn_chain.h.

    model = orkpy.load_model("m.gguf", weights="int8")     # gate/up/down must be packed
    stats = prep(model, calib_tokens, n_ctx=256)            # gmax, max|silu|, ... per layer
    configure(model, stats, "fused")                        # every layer on the fused chain
    configure(model, stats, sprinkle(stats, "auto"))        # exact fp32 SiLU on the high-gmax layers
    modes, report = sensitivity_sprinkle(model, stats, other_tokens, n_ctx=256, chunks=8)  # ... or on the
                                                            # layers whose exact SiLU lowers the KL most

Modes: ``baseline`` (per-op w8a8, float SiLU: the chain is off), ``fused``,
``exact_silu``, ``fp32_silu_out``, ``exact_lut_input``, ``clip_pct_<P>``,
``asym_zero_point``, ``per_channel_out``, ``unfused``, ``split_product`` (the chain with
its int8 x int8 product handed to the down task exactly, as two int8 digit planes: no
product scale; 2x the down task's MACs; csrc/ork/ffn_chain.h).

The gate function is the model's (``model.hparams["gate_fn"]``, the ``gate_fn`` of its row in
:mod:`orkpy.formats.arch`: SiLU, or GELU-tanh for the Gemma family, GeGLU). The C model
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

gmax is a poor predictor of which layer matters. The sensitivity sprinkle
(:func:`sensitivity_sprinkle`) measures it instead: the mean KL between the
per-op model and the chain with a set of exact layers, on calibration text
(never the scored text), searched greedily (``lazy``: lazy greedy, the default;
``greedy``; or ``single``, each layer's gain alone measured once, the cheap
proxy) under a budget: a number of layers (default :func:`default_budget`, 25%
of the layers rounded down) or a KL target. The same search with
``exact="unfused"`` chooses which layers leave the fused chain for the un-fused
fp16 ops. Cost: n + 1 forward passes over the calibration chunks for the gains
alone, then about one to a few per chosen layer (``lazy``), n - j at step j
(``greedy``). Measured: bench/ffn_sweep.py (stories260K), bench/real_quant.py
(the real models).
"""
import math

import numpy as np

from .. import _core

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
    elif isinstance(select, str) and select == "sensitivity":
        raise ValueError("the sensitivity sprinkle measures the model: sensitivity_sprinkle(model, stats, "
                         "calib_tokens, ...)")
    else:
        raise ValueError(f"bad sprinkle selection {select!r}")
    return ["exact_silu" if i in exact else "fused" for i in range(len(g))]


SENS_SHARE = 0.25
SENS_METHODS = ("lazy", "greedy", "single")


def default_budget(n_layer):
    """The sensitivity sprinkle's default number of exact layers: 25% of the layers rounded
    down (never above a quarter), at least 1: 1 of 5, 4 of 18, 7 of 30."""
    return max(1, int(n_layer) // 4)


def _sens_args(n, budget, method):
    """(most layers, KL target or None) of a sensitivity budget; ValueError on a bad budget or method."""
    if method not in SENS_METHODS:
        raise ValueError(f"unknown sensitivity method {method!r} (expected one of {', '.join(SENS_METHODS)})")
    if budget is None:
        return default_budget(n), None
    if isinstance(budget, (int, np.integer)) and not isinstance(budget, bool):
        if not 0 <= budget <= n:
            raise ValueError(f"budget of {budget} exact layers: the model has {n} layers")
        return int(budget), None
    if isinstance(budget, float):
        if not (math.isfinite(budget) and budget >= 0):
            raise ValueError(f"KL target must be a finite float >= 0, got {budget}")
        return n, budget
    raise ValueError(f"bad budget {budget!r} (None, a number of layers or a float KL target)")


def sensitivity_search(kl, n, budget=None, method="lazy", log=None):
    """The search of :func:`sensitivity_sprinkle` over any cost ``kl(layers)`` (a tuple of exact
    layers -> the KL it leaves; each distinct set is measured once): a dict with
    ``exact_layers`` (sorted), ``steps`` (layer added, KL after it; in order), ``kl_fused``,
    ``kl_single`` (each layer exact alone), ``gain``, ``kl`` (of the chosen set) and
    ``evaluations`` (distinct sets measured)."""
    log = log or (lambda m: None)
    k_max, target = _sens_args(n, budget, method)
    cache = {}

    def cost(layers):
        key = frozenset(layers)
        if key not in cache:
            cache[key] = float(kl(tuple(sorted(key))))
        return cache[key]

    kl_fused = cost(())
    single = [cost((i,)) for i in range(n)]
    log("KL all fused %.6f; gain of each layer alone " % kl_fused
        + ", ".join(f"{i}: {kl_fused - v:.6f}" for i, v in enumerate(single)))
    chosen, cur, steps = [], kl_fused, []
    bound = {i: kl_fused - single[i] for i in range(n)}  # a gain, measured when len(chosen) was fresh[i]
    fresh = dict.fromkeys(range(n), 0)
    while len(chosen) < k_max and (target is None or cur > target):
        if method == "greedy":
            for i in bound:
                bound[i], fresh[i] = cur - cost(chosen + [i]), len(chosen)
        while method != "single":  # lazy: re-measure the best bound until it is current
            best = min(bound, key=lambda i: (-bound[i], i))
            if fresh[best] == len(chosen):
                break
            bound[best], fresh[best] = cur - cost(chosen + [best]), len(chosen)
        best = min(bound, key=lambda i: (-bound[i], i))  # single: the best gain alone
        chosen.append(best)
        del bound[best]
        cur = cost(chosen)
        steps.append({"layer": best, "kl": cur})
        log(f"+ layer {best}: KL {cur:.6f} ({len(cache)} evaluations)")
    return {"exact_layers": sorted(chosen), "steps": steps, "kl_fused": kl_fused, "kl_single": single,
            "gain": [kl_fused - v for v in single], "kl": cur, "evaluations": len(cache),
            "budget": k_max if budget is None else budget}


def sensitivity_sprinkle(model, stats, calib_tokens, n_ctx=256, chunks=None, budget=None, method="lazy",
                         exact="exact_silu", threads=None, log=None, base="fused"):
    """Choose the sprinkle's exact layers by their measured effect: (modes, report).

    The effect of a set E of exact layers (mode ``exact`` on E, ``base`` elsewhere: ``fused``
    or another chain mode, e.g. ``split_product``) is the
    mean KL(per-op model || chain) over the scored positions of ``chunks`` chunks of
    ``n_ctx`` of ``calib_tokens`` (perplexity's KL mode; the reference is the same model with
    the chain off, ``baseline``, so the KL is what the chain costs, 0 when every layer is
    exact). ``calib_tokens`` (a text or ids; ``chunks`` None: all of it) must not be the text
    the result is scored on: a choice made on the scored text is fitted to it (``sweep``
    refuses a calibration text that holds the scored one).

    ``budget``: None (:func:`default_budget`: 25% of the layers, rounded down), an int (that
    many layers), or a float (a KL target: add layers until the calibration KL is at most it).
    ``method`` (every one first measures each layer exact alone, n + 1 evaluations):

    - ``greedy``: add the layer whose addition lowers the KL most; re-measure every remaining
      layer after each addition (n + (n - 1) + ... evaluations);
    - ``lazy`` (default): greedy's choice with fewer evaluations when a layer's gain only
      shrinks as layers are added (lazy greedy: a layer's last measured gain stands for its
      gain now; only the best one is re-measured, and taken if it still beats every other);
      where gains grow instead it may differ from greedy;
    - ``single``: the proxy measured once: the layers with the largest gain alone (KL all
      fused minus KL with that layer exact) are taken.

    ``exact``: the mode of the chosen layers: ``exact_silu`` (the host's fp32 activation),
    ``unfused`` (the per-layer choice between the fused chain and the un-fused fp16 ops) or
    another chain mode. Ties keep the lower layer index. The model is left configured with
    the returned modes. The search's set is then checked against the gmax rule's (:func:`sprinkle`
    with as many layers) on the same calibration KL, one more evaluation, and the better one is
    returned, so the result is never worse than gmax's on the text it is chosen on. The report
    (JSON-able): :func:`sensitivity_search`'s dict plus ``gmax_layers``, ``kl_gmax``, ``chose``
    ("search" or "gmax"), ``method``, ``exact``, ``base``, ``n_ctx``, ``chunks`` and ``seconds``
    (the wall time)."""
    import os
    import tempfile
    import time

    from .ppl import perplexity

    t0 = time.perf_counter()
    n = model.hparams["n_layer"]
    if base not in MODES or base == "baseline":
        raise ValueError(f"base mode {base!r} must be a chain mode ({', '.join(MODES[1:])})")
    if exact not in MODES or exact in ("baseline", base):
        raise ValueError(f"exact mode {exact!r} must be a chain mode other than {base} "
                         f"({', '.join(md for md in MODES if md not in ('baseline', base))})")
    _sens_args(n, budget, method)  # checked before any forward pass
    tokens = model.tokens(calib_tokens)
    kw = dict(n_ctx=n_ctx, chunks=chunks, threads=threads, progress=False)
    with tempfile.TemporaryDirectory(prefix="orkpy-sens-") as work:
        ref = os.path.join(work, "ref.npz")
        configure(model, stats, "baseline")
        n_chunk = perplexity(model, tokens, save_logprobs=ref, **kw).chunks

        def kl(layers):
            configure(model, stats, [exact if i in layers else base for i in range(n)])
            return perplexity(model, tokens, kld_base=ref, **kw).kld["mean"]

        log = log or (lambda m: None)
        rep = sensitivity_search(kl, n, budget, method, log=lambda m: log(f"sensitivity ({exact}): {m}"))
        # the gmax rule's layers, as many, measured the same way: taken when they do better here
        k = len(rep["exact_layers"])
        gm = [i for i, md in enumerate(sprinkle(stats, k)) if md == "exact_silu"] if k else []
        rep["gmax_layers"], rep["chose"] = gm, "search"
        rep["kl_gmax"] = rep["kl"] if gm == rep["exact_layers"] else kl(tuple(gm))
        if rep["kl_gmax"] < rep["kl"]:
            log(f"sensitivity ({exact}): the gmax layers {gm} do better on the calibration text "
                f"({rep['kl_gmax']:.6f} vs {rep['kl']:.6f}): taken")
            rep.update(exact_layers=gm, kl=rep["kl_gmax"], chose="gmax")
    modes = configure(model, stats, [exact if i in rep["exact_layers"] else base for i in range(n)])
    rep.update(method=method, exact=exact, base=base, n_ctx=n_ctx, chunks=n_chunk, seconds=time.perf_counter() - t0)
    return modes, rep


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
#: calibration tokens of the sweep's sensitivity search (chunks of n_ctx, at least 2) unless sens_chunks says
SENS_TOKENS = 2048
OVERLAP_WINDOW = 32


def text_overlap(scored, calib, window=OVERLAP_WINDOW):
    """The share of the scored ids' non-overlapping ``window``-token windows that occur anywhere
    in the calibration ids (0: disjoint texts; 1: the scored text is inside the calibration)."""
    scored, calib = np.asarray(scored, np.int64), np.asarray(calib, np.int64)
    if len(scored) < window or len(calib) < window:
        return 0.0
    pw = np.uint64(1_000_003) ** np.arange(window, dtype=np.uint64)  # wraps mod 2^64: a hash

    def hashes(t, step):
        v = np.lib.stride_tricks.sliding_window_view(t.astype(np.uint64), window)[::step]
        return (v * pw).sum(axis=1)
    with np.errstate(over="ignore"):
        return float(np.isin(hashes(scored, window), hashes(calib, 1)).mean())


def sweep(model_path, text, calib_text, n_ctx=256, chunks=None, calib_chunks=None, threads=None, progress=False,
          log=None, meta=None, sens_chunks=None, sens_budget=None, sens_method="lazy", act="per_token",
          act_calib=None, rotate=None, smooth=None, rotate_online=False):
    """Every configuration of the issue's sweep; rows of dict(mode, exact_layers, ppl, ppl_err, kl, wall_s).
    ``meta``: a safetensors source's GGUF for hyper-parameters and tokenizer (:func:`orkpy.load_model`).
    The sensitivity rows (:func:`sensitivity_sprinkle` on ``sens_chunks`` chunks of the calibration
    text, default ``SENS_TOKENS`` tokens' worth; ``sens_budget``, ``sens_method``) also carry
    ``calib_s`` (the search's seconds), ``calib_kl`` (its KL on the calibration text) and ``gain``
    (each layer's KL gain alone); ``sprinkle_gmax`` repeats the gmax sprinkle row with as many
    exact layers as ``sprinkle_sensitivity``. A calibration text holding half or more of the
    scored text's 32-token windows is a ValueError. ``act`` / ``act_calib`` (the packed linears'
    activation mode, :func:`orkpy.load_model`; the chain quantizes its input in it) and ``rotate`` /
    ``smooth`` (folded into the int8 model, calibrated on ``calib_text``) change the quantized model;
    the reference stays the float model as given, so the KL includes what they cost or save."""
    import os
    import tempfile
    import time

    from ..runtime.model import load_model
    from .ppl import perplexity

    log = log or (lambda m: None)
    if rotate_online:
        raise ValueError("rotate_online rotates ffn_down's input inside the FFN, which the fused chain does not "
                         "model: sweep with rotate='hadamard' alone")
    with tempfile.TemporaryDirectory(prefix="orkpy-ffn-") as work:  # the reference log-probs, removed after
        ref_lp = os.path.join(work, "ref.npz")
        ref = load_model(model_path, weights="gguf", meta=meta)
        tokens = ref.tokens(text)  # tokenized once: every configuration scores these ids
        n_scored, _ = ref.chunks(tokens, n_ctx, chunks)
        calib_tokens = ref.tokenizer.encode(calib_text)
        shared = text_overlap(tokens[: n_scored * n_ctx], calib_tokens)
        if shared >= 0.5:
            raise ValueError(f"the calibration text holds {shared:.0%} of the scored text's {OVERLAP_WINDOW}-token "
                             "windows: calibrate (--calib) on a text that is not scored")
        perplexity(ref, tokens, n_ctx=n_ctx, chunks=chunks, threads=threads, progress=progress, save_logprobs=ref_lp)
        del ref
        m = load_model(model_path, weights="int8", meta=meta, act=act, act_calib=act_calib, rotate=rotate,
                       smooth=smooth, calib=calib_text, calib_ctx=n_ctx, calib_chunks=calib_chunks)
        stats = prep(m, calib_tokens, n_ctx=n_ctx, chunks=calib_chunks, threads=threads)
        n = m.hparams["n_layer"]
        rows = []

        def run(label, modes, layers=None, **extra):
            t0 = time.perf_counter()
            modes = configure(m, stats, modes)
            r = perplexity(m, tokens, n_ctx=n_ctx, chunks=chunks, threads=threads, progress=progress,
                           kld_base=ref_lp)
            exact = [i for i, md in enumerate(modes) if md in ("exact_silu", "baseline")] if layers is None else layers
            rows.append(dict({"mode": label, "exact_layers": exact, "ppl": r.ppl, "ppl_err": r.ppl_err,
                              "kl": r.kld["mean"], "wall_s": time.perf_counter() - t0}, **extra))
            log(f"{label:<30} exact {str(exact):<20} PPL {r.ppl:.4f} KL {r.kld['mean']:.6f}")

        for mode in ("baseline", "fused", "exact_silu", "fp32_silu_out", "exact_lut_input"):
            run(mode, mode)
        for pct in SWEEP_CLIPS:
            run(f"clip_pct_{pct:g}", f"clip_pct_{pct:g}")
        for mode in ("asym_zero_point", "per_channel_out", "unfused", "split_product"):
            run(mode, mode)
        for k in range(n + 1):
            run("sprinkle", sprinkle(stats, k))
        run("sprinkle_auto", sprinkle(stats, "auto"))
        sens_chunks = sens_chunks or max(2, SENS_TOKENS // n_ctx)
        for exact, base, label in (("exact_silu", "fused", "sprinkle_sensitivity"),
                                   ("unfused", "fused", "sprinkle_sensitivity_unfused"),
                                   ("exact_silu", "split_product", "sprinkle_sensitivity_split")):
            modes, rep = sensitivity_sprinkle(m, stats, calib_tokens, n_ctx=n_ctx, chunks=sens_chunks,
                                              budget=sens_budget, method=sens_method, exact=exact, threads=threads,
                                              log=log, base=base)
            run(label, modes, rep["exact_layers"], calib_s=rep["seconds"], calib_kl=rep["kl"], gain=rep["gain"],
                method=rep["method"], budget=rep["budget"], calib_chunks=rep["chunks"], base=base,
                chose=rep["chose"], gmax_layers=rep["gmax_layers"], calib_kl_gmax=rep["kl_gmax"])
            if exact == "exact_silu":
                k = len(rep["exact_layers"])
                rows.append(dict(next(r for r in rows if r["mode"] == "sprinkle" and len(r["exact_layers"]) == k),
                                 mode="sprinkle_gmax"))
        return rows, stats
