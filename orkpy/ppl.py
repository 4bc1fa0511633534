"""Perplexity with llama-perplexity's method, and its KL-divergence mode.

Method (llama.cpp tools/perplexity, ../shared/docs/quant-anchors.md §5):
tokenize the whole text once (BOS prepended only if the vocabulary adds one);
split into non-overlapping chunks of ``n_ctx`` tokens (``floor(N / n_ctx)``
chunks, at most ``chunks``); if the vocabulary adds BOS, the first token of
each chunk is replaced by BOS for the forward pass; score only the second
half: the logits at positions ``n_ctx/2 .. n_ctx-2`` against the next token
(``n_ctx - n_ctx/2 - 1`` tokens per chunk); ``nll = -(l[t] - max -
log(sum exp(l - max)))`` with the sum in double. Final ``PPL = exp(mean)``
and ``+/- = PPL * sqrt((mean(nll^2) - mean^2) / (count - 1))``.

KL mode: ``perplexity(ref_model, ..., save_logprobs="ref.npz")`` stores the
reference log-probabilities of every scored position once;
``perplexity(model, ..., kld_base="ref.npz")`` then reports the mean
KL(ref || model), its percentiles, top-token agreement and delta-PPL on the
same tokens (like ``llama-perplexity --kl-divergence``).
"""
import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

from . import _core
from ._io import progress_bar

__all__ = ["PPLResult", "perplexity", "tokens_for_ppl"]


@dataclass
class PPLResult:
    ppl: float
    ppl_err: float
    nll_mean: float
    n_tokens: int          # tokens in the tokenized text
    chunks: int            # chunks evaluated
    n_ctx: int
    scored: int            # scored tokens
    wall_time: float       # seconds
    config: dict = field(default_factory=dict)
    kld: Optional[dict] = None
    chunk_ppl: list = field(default_factory=list)  # running PPL after each chunk

    def to_json(self, **kw):
        return json.dumps(asdict(self), **kw)

    def __str__(self):
        s = (f"PPL = {self.ppl:.4f} +/- {self.ppl_err:.5f} ({self.chunks} chunks of {self.n_ctx}, "
             f"{self.scored} scored tokens, {self.wall_time:.1f} s)")
        if self.kld:
            k = self.kld
            s += (f"\nmean KLD {k['mean']:.6f} +/- {k['mean_err']:.6f}, same top token {100 * k['same_top']:.3f} %, "
                  f"PPL(base) {k['ppl_base']:.4f}, delta PPL {k['delta_ppl']:+.4f}")
        return s


def tokens_for_ppl(model, text_or_tokens, add_bos=None):
    """int32 token ids: a str is tokenized with the model's own tokenizer (BOS as
    the vocabulary says, or as add_bos says); an int array is used as given."""
    if isinstance(text_or_tokens, str):
        special = model.tokenizer.add_bos if add_bos is None else bool(add_bos)
        return np.asarray(model.tokenizer.encode(text_or_tokens, add_special=special), dtype=np.int32)
    t = np.asarray(text_or_tokens)
    if t.ndim != 1 or not np.issubdtype(t.dtype, np.integer):
        raise TypeError("text_or_tokens must be a str or a 1-D integer array of token ids")
    if t.size and (t.min() < 0 or t.max() >= model.n_vocab):
        bad = int(np.flatnonzero((t < 0) | (t >= model.n_vocab))[0])
        raise ValueError(f"token id {int(t[bad])} at index {bad} is outside the vocabulary ({model.n_vocab})")
    return t.astype(np.int32)


def _log_softmax(logits):
    lg = logits.astype(np.float64)
    mx = lg.max(axis=1, keepdims=True)
    return lg - mx - np.log(np.exp(lg - mx).sum(axis=1, keepdims=True))


def perplexity(model, text_or_tokens, n_ctx=512, chunks=None, threads=None, progress=True,
               save_logprobs=None, kld_base=None, add_bos=None):
    """Perplexity of ``model`` (an :class:`orkpy.Model`) on a text or token ids."""
    t0 = time.perf_counter()
    from .calibrate import _as_model
    model = _as_model(model)
    if not isinstance(n_ctx, int) or n_ctx < 4 or n_ctx % 2:
        raise ValueError(f"n_ctx must be an even int >= 4, got {n_ctx!r}")
    tokens = tokens_for_ppl(model, text_or_tokens, add_bos)
    if add_bos is None:
        add_bos = model.tokenizer.add_bos
    n = len(tokens)
    if n < 2 * n_ctx:
        raise ValueError(f"need at least 2 * n_ctx = {2 * n_ctx} tokens, got {n}")
    n_chunk = n // n_ctx
    if chunks is not None:
        if not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"chunks must be a positive int, got {chunks!r}")
        n_chunk = min(n_chunk, chunks)
    first = n_ctx // 2
    bos = model.tokenizer.bos_id if add_bos else None
    base = None
    if kld_base is not None:
        base = np.load(kld_base)
        if int(base["n_ctx"]) != n_ctx or base["logprobs"].shape[0] < n_chunk * (n_ctx - first - 1):
            raise ValueError(f"{kld_base}: reference was made with n_ctx {int(base['n_ctx'])} and "
                             f"{base['logprobs'].shape[0]} scored tokens; this run needs n_ctx {n_ctx} and "
                             f"{n_chunk * (n_ctx - first - 1)}")
        if not np.array_equal(base["tokens"][: n_chunk * n_ctx], tokens[: n_chunk * n_ctx]):
            raise ValueError(f"{kld_base}: reference tokens differ from this text's tokens")
    nlls, saved, kl, same = [], [], [], []
    chunk_ppl = []
    bar = progress_bar(n_chunk, "perplexity", progress, "chunk")
    for c in range(n_chunk):
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx].copy()
        if bos is not None:
            chunk[0] = bos
        logits = model.forward(chunk, first=first, threads=threads)[:-1]  # positions first .. n_ctx-2
        targets = tokens[c * n_ctx + first + 1:(c + 1) * n_ctx]
        nll = _core.nll_rows(np.ascontiguousarray(logits), targets)
        nlls.append(nll)
        if save_logprobs is not None or base is not None:
            lp = _log_softmax(logits)
            if save_logprobs is not None:
                saved.append(lp.astype(np.float32))
            if base is not None:
                rows = slice(c * len(targets), (c + 1) * len(targets))
                ref = base["logprobs"][rows].astype(np.float64)
                kl.append((np.exp(ref) * (ref - lp)).sum(axis=1))
                same.append(ref.argmax(1) == lp.argmax(1))
        allnll = np.concatenate(nlls)
        chunk_ppl.append(float(math.exp(allnll.mean())))
        if bar is not None:
            bar.set_postfix(ppl=f"{chunk_ppl[-1]:.4f}")
            bar.update(1)
    if bar is not None:
        bar.close()
    allnll = np.concatenate(nlls)
    count = len(allnll)
    mean = float(allnll.mean())
    m2 = float((allnll ** 2).mean())
    ppl = math.exp(mean)
    err = ppl * math.sqrt(max(m2 - mean * mean, 0.0) / (count - 1))
    result = PPLResult(ppl=ppl, ppl_err=err, nll_mean=mean, n_tokens=n, chunks=n_chunk, n_ctx=n_ctx, scored=count,
                       wall_time=0.0, config=dict(model.config, add_bos=bool(add_bos)), chunk_ppl=chunk_ppl)
    if save_logprobs is not None:
        from ._io import atomic_write
        import io
        buf = io.BytesIO()
        np.savez(buf, logprobs=np.concatenate(saved), nll=allnll, tokens=tokens, n_ctx=n_ctx)
        atomic_write(save_logprobs, [buf.getvalue()])
    if base is not None:
        kls = np.concatenate(kl)
        base_nll = base["nll"][:count]
        ppl_base = math.exp(float(base_nll.mean()))
        result.kld = {
            "mean": float(kls.mean()),
            "mean_err": float(kls.std(ddof=1) / math.sqrt(len(kls))),
            "median": float(np.median(kls)),
            "p99": float(np.percentile(kls, 99)),
            "max": float(kls.max()),
            "same_top": float(np.concatenate(same).mean()),
            "ppl_base": ppl_base,
            "delta_ppl": ppl - ppl_base,
            "ppl_ratio": ppl / ppl_base,
        }
    result.wall_time = time.perf_counter() - t0
    return result
