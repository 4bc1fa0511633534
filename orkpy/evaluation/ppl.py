"""Perplexity with llama-perplexity's method, and its KL-divergence mode.

Method (llama.cpp tools/perplexity/perplexity.cpp, ``perplexity()``):
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

Reference file (``save_logprobs``, an ``.npz``; version 2): per scored token
the top token id and its log-prob (float64), and the whole vocabulary's
log-probs as uint16 codes on a square-root scale below the top: with
``d = lp_top - lp`` (nats, >= 0) and the row's range ``R = min(max d, 64)``,
``code = round(65535 * sqrt(min(d, R) / R))``, decoded as
``lp = lp_top - R * (code / 65535)**2``. A log-prob's error is at most
``(2 * sqrt(d / R) + 1 / 65535) * R / 131070`` nats: 0 for the top token,
``~1.2e-4 * sqrt(d)`` near it, below ``1e-3`` anywhere; tokens more than 64
nats under the top (relative probability < 2e-28) are stored at 64. The
per-token NLLs are kept exactly (float64), so delta PPL is unchanged, and so
is same-top (the stored top id). The file is about half the float32 size
(per scored token 2 bytes per vocabulary entry + 24 bytes, instead of 4 per
entry). Version-1 files (float32 ``logprobs``) are still read.
"""
from __future__ import annotations

import json
import math
import time
import zipfile
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core
from .._io import atomic_open, progress_bar
from .._typing import StrPath
from ..runtime.model import Model, as_model

if TYPE_CHECKING:
    from ..quantization.calibrate import QuantizedModel

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
    config: Dict[str, Any] = field(default_factory=dict)
    kld: Optional[Dict[str, float]] = None
    chunk_ppl: List[float] = field(default_factory=list)  # running PPL after each chunk

    def to_json(self, **kw: Any) -> str:
        return json.dumps(asdict(self), **kw)

    def __str__(self) -> str:
        s = (f"PPL = {self.ppl:.4f} +/- {self.ppl_err:.5f} ({self.chunks} chunks of {self.n_ctx}, "
             f"{self.scored} scored tokens, {self.wall_time:.1f} s)")
        if self.kld:
            k = self.kld
            s += (f"\nmean KLD {k['mean']:.6f} +/- {k['mean_err']:.6f}, same top token {100 * k['same_top']:.3f} %, "
                  f"PPL(base) {k['ppl_base']:.4f}, delta PPL {k['delta_ppl']:+.4f}")
        return s


def tokens_for_ppl(model: Union[Model, QuantizedModel], text_or_tokens: Union[str, ArrayLike],
                   add_bos: Optional[bool] = None) -> NDArray[np.int32]:
    """int32 token ids (:meth:`Model.tokens`): a str is tokenized with the model's own
    tokenizer (BOS as the vocabulary says, or as add_bos says); an int array is used as given."""
    return as_model(model).tokens(text_or_tokens, add_bos)


def _log_softmax(logits: NDArray[Any]) -> NDArray[np.float64]:
    lg = logits.astype(np.float64)
    mx = lg.max(axis=1, keepdims=True)
    return lg - mx - np.log(np.exp(lg - mx).sum(axis=1, keepdims=True))


LP_VERSION = 2
LP_RANGE = 64.0   # nats below the top log-prob that the codes cover
_QMAX = 65535


def encode_logprobs(lp: ArrayLike) -> Tuple[NDArray[np.uint16], NDArray[np.float64], NDArray[np.float32],
                                           NDArray[np.int32]]:
    """(codes uint16, lp_top float64, lp_range float32, top_id int32) of a
    (rows, V) array of log-probs; the scale is in the module doc."""
    lp = np.asarray(lp, np.float64)
    top_id = lp.argmax(axis=1)
    top = lp[np.arange(len(lp)), top_id]
    d = top[:, None] - lp
    rng = np.minimum(np.nan_to_num(d.max(axis=1), posinf=LP_RANGE), LP_RANGE).astype(np.float32)
    rng = np.where(rng > 0, rng, np.float32(1.0))  # a flat row: every code is 0
    r = rng.astype(np.float64)[:, None]
    codes = np.rint(np.sqrt(np.minimum(d, r) / r) * _QMAX).astype(np.uint16)
    return codes, top, rng, top_id.astype(np.int32)


def decode_logprobs(codes: NDArray[Any], lp_top: NDArray[Any], lp_range: NDArray[Any]) -> NDArray[np.float64]:
    """float64 (rows, V) log-probs from :func:`encode_logprobs` output."""
    u = codes.astype(np.float64) * (1.0 / _QMAX)
    return lp_top.astype(np.float64)[:, None] - lp_range.astype(np.float64)[:, None] * (u * u)


class _Reference:
    """A saved reference (version 1: float32 log-probs; version 2: compact)."""

    def __init__(self, path: StrPath) -> None:
        self.path = path
        what = f"{path}: not an orkpy reference log-prob file (written by save_logprobs / --save-logprobs)"
        try:
            z = np.load(path, allow_pickle=False)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            raise
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise ValueError(f"{what}: {e}") from None
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError(f"{what}: a single array, not an .npz archive")
        with z:
            try:
                self.version = int(z["version"]) if "version" in z.files else 1
                if self.version == 1:
                    self.logprobs = z["logprobs"]
                    self.rows, self.n_vocab = self.logprobs.shape
                elif self.version == LP_VERSION:
                    self.codes, self.lp_top = z["lp_codes"], z["lp_top"]
                    self.lp_range, self.top_id = z["lp_range"], z["top_id"]
                    self.rows, self.n_vocab = self.codes.shape
                else:
                    raise ValueError(f"{path}: reference log-prob file version {self.version} is not supported "
                                     f"(this orkpy reads 1 and {LP_VERSION})")
                self.nll, self.tokens, self.n_ctx = z["nll"], z["tokens"], int(z["n_ctx"])
            except KeyError as e:
                raise ValueError(f"{what}: no {e} array") from None
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
                if str(e).startswith(f"{path}:"):
                    raise
                raise ValueError(f"{what}: {e}") from None

    def logprobs_rows(self, rows: slice) -> Tuple[NDArray[np.float64], NDArray[Any]]:
        """(log-probs float64, top token ids) of the scored positions ``rows`` (a slice)."""
        if self.version == 1:
            ref = self.logprobs[rows].astype(np.float64)
            return ref, ref.argmax(axis=1)
        return decode_logprobs(self.codes[rows], self.lp_top[rows], self.lp_range[rows]), self.top_id[rows]


def perplexity(model: Union[Model, QuantizedModel], text_or_tokens: Union[str, ArrayLike], n_ctx: int = 512,
               chunks: Optional[int] = None, threads: Optional[int] = None, progress: bool = True,
               save_logprobs: Optional[StrPath] = None, kld_base: Optional[StrPath] = None,
               add_bos: Optional[bool] = None) -> PPLResult:
    """Perplexity of ``model`` (an :class:`orkpy.Model`) on a text or token ids."""
    t0 = time.perf_counter()
    model = as_model(model)
    if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 4 or n_ctx % 2:
        raise ValueError(f"n_ctx must be an even int >= 4, got {n_ctx!r}")
    tokens = model.tokens(text_or_tokens, add_bos)
    if add_bos is None:
        add_bos = model.tokenizer.add_bos
    n = len(tokens)
    if n < 2 * n_ctx:
        raise ValueError(f"need at least 2 * n_ctx = {2 * n_ctx} tokens, got {n}")
    n_chunk, chunk_iter = model.chunks(tokens, n_ctx, chunks, add_bos)
    first = n_ctx // 2
    base = None
    per_chunk = n_ctx - first - 1
    if kld_base is not None:
        base = _Reference(kld_base)
        if base.n_ctx != n_ctx or base.rows < n_chunk * per_chunk:
            raise ValueError(f"{kld_base}: reference was made with n_ctx {base.n_ctx} and "
                             f"{base.rows} scored tokens; this run needs n_ctx {n_ctx} and "
                             f"{n_chunk * per_chunk}")
        if base.n_vocab != model.n_vocab:
            raise ValueError(f"{kld_base}: reference has a vocabulary of {base.n_vocab}, this model {model.n_vocab}")
        if not np.array_equal(base.tokens[: n_chunk * n_ctx], tokens[: n_chunk * n_ctx]):
            raise ValueError(f"{kld_base}: reference tokens differ from this text's tokens")
    if save_logprobs is not None:
        # Any: np.savez(**saved) must not look as if it could pass allow_pickle
        saved: Dict[str, Any] = dict(lp_codes=np.empty((n_chunk * per_chunk, model.n_vocab), np.uint16),
                                     lp_top=np.empty(n_chunk * per_chunk, np.float64),
                                     lp_range=np.empty(n_chunk * per_chunk, np.float32),
                                     top_id=np.empty(n_chunk * per_chunk, np.int32))
    nlls, kl, same = [], [], []
    chunk_ppl = []
    bar = progress_bar(n_chunk, "perplexity", progress, "chunk")
    buf = np.empty((n_ctx - first, model.n_vocab), np.float32)  # one logits buffer for every chunk
    for c, chunk in enumerate(chunk_iter):
        logits = model.forward(chunk, first=first, threads=threads, out=buf)[:-1]  # positions first .. n_ctx-2
        targets = tokens[c * n_ctx + first + 1:(c + 1) * n_ctx]
        nll = _core.nll_rows(np.ascontiguousarray(logits), targets, 0 if threads is None else int(threads))
        nlls.append(nll)
        if save_logprobs is not None or base is not None:
            lp = _log_softmax(logits)
            rows = slice(c * per_chunk, (c + 1) * per_chunk)
            if save_logprobs is not None:
                enc = encode_logprobs(lp)
                for k, a in zip(("lp_codes", "lp_top", "lp_range", "top_id"), enc):
                    saved[k][rows] = a
            if base is not None:
                ref, ref_top = base.logprobs_rows(rows)
                kl.append((np.exp(ref) * (ref - lp)).sum(axis=1))
                same.append(ref_top == lp.argmax(1))
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
        with atomic_open(save_logprobs) as f:
            np.savez(f, version=LP_VERSION, nll=allnll, tokens=tokens[: n_chunk * n_ctx], n_ctx=n_ctx, **saved)
    if base is not None:
        kls = np.concatenate(kl)
        base_nll = base.nll[:count]
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
