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
entry). Version-1 files (float32 ``logprobs``) are still read. The reader trusts nothing in the file:
every field is checked against what this writer guarantees (docs/security.md) and anything else is an
:class:`orkpy.FormatError` naming the file and the field.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import struct
import time
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core
from .._core import FormatError
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
    chunk_kld: List[float] = field(default_factory=list)  # with kld_base: each chunk's mean KL divergence
    chunk_same_top: List[float] = field(default_factory=list)  # with kld_base: each chunk's same-top-token share

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


#: the members (np.savez names) of a reference file, per version: nothing else is read or accepted
_FIELDS = {1: ("logprobs", "nll", "tokens", "n_ctx"),
           2: ("version", "nll", "tokens", "n_ctx", "lp_codes", "lp_top", "lp_range", "top_id")}
#: |log sum exp| of a decoded row: each decoded log-prob is within 2 * LP_RANGE / 131070 (~9.8e-4) nats
_NORM_TOL = 2e-3
#: |-nll - log-prob of the target| beyond the codes' own error bound (float32 logits in nll_rows)
_NLL_TOL = 1e-4
_N_CTX_MAX = 1 << 30
_NLL_MEAN_MAX = 709.78   # just below log(DBL_MAX) = 709.7827: math.exp of the mean NLL is finite
_BLOCK = 1 << 21          # elements of a row block checked at once (bounded temporaries)
_MEMBERS_MAX = 16
_DEFLATE_RATIO = 1032     # deflate's largest expansion: a member cannot claim more data than that


_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADER_MAX = 10000   # numpy's own limit on a header it parses
# the header np.save writes (keys sorted, a trailing comma, padded with spaces and a newline); only
# plain little/big-endian numbers of 1 to 8 bytes and up to 8 dimensions
_NPY_TYPES = ("b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8")
_NPY_HEADER = re.compile(r"\{'descr': *'([<>|=][biuf][1248])', *'fortran_order': *(False|True), *"
                         r"'shape': *\(((?:\d{1,19}, *){0,7}(?:\d{1,19})?)\), *\} *\n?\Z")


def _npy_member(m: Any, file_size: int, where: str) -> NDArray[Any]:
    """One .npy member of an .npz, its header (read here, strictly, not by NumPy's literal parser)
    checked against the member's size before any data is read."""
    head = m.read(len(_NPY_MAGIC) + 2)
    if len(head) < 8 or head[:6] != _NPY_MAGIC or head[6] not in (1, 2) or head[7] != 0:
        raise FormatError(f"{where}: not a .npy array of format 1.0 or 2.0 (np.savez writes 1.0)")
    n_len = 2 if head[6] == 1 else 4
    raw_len = m.read(n_len)
    hlen = int.from_bytes(raw_len, "little") if len(raw_len) == n_len else -1
    if not 0 < hlen <= min(_NPY_HEADER_MAX, file_size):
        raise FormatError(f"{where}: .npy header length {hlen} out of range")
    header = m.read(hlen)
    hit = _NPY_HEADER.match(header.decode("latin-1")) if len(header) == hlen else None
    if hit is None:
        raise FormatError(f"{where}: .npy header {header[:80]!r} is not a plain number array's")
    if hit.group(1)[1:] not in _NPY_TYPES:
        raise FormatError(f"{where}: .npy dtype {hit.group(1)!r} is not a plain number type")
    dtype = np.dtype(hit.group(1))
    fortran = hit.group(2) == "True"
    dims = [d for d in hit.group(3).replace(" ", "").split(",") if d]
    if len(dims) == 1 and not hit.group(3).rstrip(" ").endswith(","):
        raise FormatError(f"{where}: .npy shape ({hit.group(3)}) is not a tuple")
    shape = tuple(int(d) for d in dims)
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    have = file_size - (len(_NPY_MAGIC) + 2 + n_len + hlen)
    if have != nbytes:
        raise FormatError(f"{where}: shape {shape} of {dtype} needs {nbytes} bytes, the member holds {have}")
    raw = m.read(nbytes)
    if len(raw) != nbytes or m.read(1):
        raise FormatError(f"{where}: the member's data is truncated")
    a = np.frombuffer(raw, dtype, count=count).reshape(shape, order="F" if fortran else "C")
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def _npz_members(path: str, what: str) -> Dict[str, NDArray[Any]]:
    """{name: array} of an uncompressed or deflated .npz (np.savez), every size checked against the file
    before anything is read; FormatError naming the file for anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{what}: not a regular file")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    out: Dict[str, NDArray[Any]] = {}
    with f:
        try:
            with zipfile.ZipFile(f) as zf:
                infos = zf.infolist()
                if len(infos) > _MEMBERS_MAX:
                    raise FormatError(f"{what}: {len(infos)} members")
                for info in infos:
                    name = info.filename
                    key = name[:-4]
                    if not (name.endswith(".npy") and key.isidentifier()) or key in out:
                        raise FormatError(f"{what}: unexpected member {name[:80]!r}")
                    if info.flag_bits & 1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                        raise FormatError(f"{what}: member {name!r} is encrypted or compressed other than by deflate")
                    if info.compress_size > st.st_size or info.file_size > (
                            info.compress_size if info.compress_type == zipfile.ZIP_STORED
                            else _DEFLATE_RATIO * info.compress_size + 64):
                        raise FormatError(f"{what}: member {name!r} claims {info.file_size} bytes "
                                          f"({info.compress_size} stored) in a file of {st.st_size}")
                    with zf.open(info) as m:
                        out[key] = _npy_member(m, info.file_size, f"{path}: field {key!r}")
        except FormatError:
            raise
        except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, ValueError, struct.error,
                NotImplementedError, RuntimeError, OverflowError, KeyError, IndexError) as e:
            raise FormatError(f"{what}: {type(e).__name__}: {str(e)[:200]}") from None
    return out


class _Reference:
    """A saved reference (version 1: float32 log-probs; version 2: compact), every field checked
    against what :func:`perplexity` writes (docs/security.md); FormatError naming the file and the
    field otherwise."""

    def __init__(self, path: StrPath) -> None:
        self.path = path = os.fspath(path)
        what = f"{path}: not an orkpy reference log-prob file (written by save_logprobs / --save-logprobs)"
        try:
            z = _npz_members(path, what)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            raise
        except OSError as e:
            raise FormatError(f"{what}: {e}") from None
        v = z.get("version")
        self.version = 1 if v is None else self._int(v, "version")
        if self.version not in _FIELDS:
            raise FormatError(f"{path}: reference log-prob file version {self.version} is not supported "
                              f"(this orkpy reads 1 and {LP_VERSION})")
        for k in _FIELDS[self.version]:
            if k not in z and k != "version":
                raise FormatError(f"{what}: no {k!r} array (version {self.version})")
        for k in z:
            if k not in _FIELDS[self.version]:
                raise FormatError(f"{what}: unexpected member {k!r} in a version {self.version} file")
        self.n_ctx = n_ctx = self._int(z["n_ctx"], "n_ctx")
        if not (4 <= n_ctx <= _N_CTX_MAX and n_ctx % 2 == 0):
            raise self._bad("n_ctx", f"= {n_ctx} is not an even context length in [4, {_N_CTX_MAX}]")
        first = n_ctx // 2
        per_chunk = n_ctx - first - 1
        if self.version == 1:
            self.logprobs = self._array(z["logprobs"], "logprobs", 2, "f")
            self.rows, self.n_vocab = self.logprobs.shape
        else:
            self.codes = self._array(z["lp_codes"], "lp_codes", 2, "u")
            if self.codes.dtype != np.uint16:
                raise self._bad("lp_codes", f"has dtype {self.codes.dtype}, not uint16")
            self.rows, self.n_vocab = self.codes.shape
        rows, V = self.rows, self.n_vocab
        if V < 1 or rows < 1 or rows % per_chunk:
            raise self._bad("lp_codes" if self.version > 1 else "logprobs",
                            f"has shape {(rows, V)}: not whole chunks of {per_chunk} scored tokens (n_ctx {n_ctx}) "
                            "over a vocabulary")
        n_chunk = rows // per_chunk
        self.tokens = self._array(z["tokens"], "tokens", 1, "iu")
        nt = len(self.tokens)
        if nt != n_chunk * n_ctx if self.version > 1 else nt < n_chunk * n_ctx:
            raise self._bad("tokens", f"holds {nt} tokens; {n_chunk} chunks of {n_ctx} need "
                                      f"{'' if self.version > 1 else 'at least '}{n_chunk * n_ctx}")
        if nt and not (int(self.tokens.min()) >= 0 and int(self.tokens.max()) < V):
            raise self._bad("tokens", f"has an id outside the vocabulary [0, {V})")
        self.nll = self._array(z["nll"], "nll", 1, "f", rows)
        if not (np.isfinite(self.nll).all() and (self.nll >= 0).all()):
            raise self._bad("nll", "holds a value that is not a finite number >= 0")
        # perplexity() takes exp of the mean NLL after every chunk (the running PPL) before it saves: no
        # file it writes has a chunk prefix whose mean overflows a double, and KL mode reads such a prefix
        prefix = np.cumsum(self.nll.reshape(n_chunk, per_chunk).sum(axis=1)) / (per_chunk * np.arange(1, n_chunk + 1))
        if not prefix.max() <= _NLL_MEAN_MAX:
            raise self._bad("nll", f"has a mean of {prefix.max():.6g} nats over its first chunks: its PPL overflows")
        targets = self.tokens[: n_chunk * n_ctx].reshape(n_chunk, n_ctx)[:, first + 1:].reshape(-1)
        if self.version == 1:
            self._check_v1(targets)
        else:
            self.lp_top = self._array(z["lp_top"], "lp_top", 1, "f", rows)
            if not (np.isfinite(self.lp_top).all() and (self.lp_top <= 0).all()):
                raise self._bad("lp_top", "holds a value that is not a finite log-prob <= 0")
            self.lp_range = self._array(z["lp_range"], "lp_range", 1, "f", rows)
            if not (np.isfinite(self.lp_range).all() and (self.lp_range > 0).all() and
                    (self.lp_range <= LP_RANGE).all()):
                raise self._bad("lp_range", f"holds a range that is not a finite number in (0, {LP_RANGE:g}]")
            self.top_id = self._array(z["top_id"], "top_id", 1, "iu", rows)
            if not (int(self.top_id.min()) >= 0 and int(self.top_id.max()) < V):
                raise self._bad("top_id", f"has an id outside the vocabulary [0, {V})")
            self._check_v2(targets)

    # ------------------------------------------------------------------ checks --
    def _bad(self, field: str, msg: str) -> FormatError:
        return FormatError(f"{self.path}: field {field!r} {msg}")

    def _int(self, a: NDArray[Any], field: str) -> int:
        if a.shape != () or a.dtype.kind not in "iu":
            raise self._bad(field, f"must be an integer scalar, got shape {a.shape} of {a.dtype}")
        return int(a)

    def _array(self, a: NDArray[Any], field: str, ndim: int, kinds: str, n: Optional[int] = None) -> NDArray[Any]:
        if a.ndim != ndim or a.dtype.kind not in kinds:
            raise self._bad(field, f"must be a {ndim}-D {'integer' if 'i' in kinds else 'number'} array, "
                                   f"got shape {a.shape} of {a.dtype}")
        if n is not None and len(a) != n:
            raise self._bad(field, f"has {len(a)} entries, the file scores {n} tokens")
        return a

    def _blocks(self) -> List[slice]:
        step = max(1, _BLOCK // max(1, self.n_vocab))
        return [slice(i, min(i + step, self.rows)) for i in range(0, self.rows, step)]

    def _row(self, ok: Any, b: slice) -> Optional[int]:
        """The file row of the first False in ``ok`` (a check over the rows of block ``b``), or None."""
        bad = np.flatnonzero(~ok)
        return None if len(bad) == 0 else int(b.start + bad[0])

    def _check_v1(self, targets: NDArray[Any]) -> None:
        for b in self._blocks():
            lp = self.logprobs[b].astype(np.float64)
            i = self._row((np.isfinite(lp) & (lp <= 0)).all(axis=1), b)
            if i is not None:
                raise self._bad("logprobs", f"row {i} holds a value that is not a finite log-prob <= 0")
            mx = lp.max(axis=1)
            s = mx + np.log(np.exp(lp - mx[:, None]).sum(axis=1))
            i = self._row(np.abs(s) <= _NORM_TOL, b)
            if i is not None:
                raise self._bad("logprobs", f"row {i} is not a distribution (log of its probability sum "
                                            f"{s[i - b.start]:.6g})")
            nll = self.nll[b]
            lt = lp[np.arange(len(lp)), targets[b]]
            i = self._row(np.abs(lt + nll) <= _NLL_TOL + 1e-6 * nll, b)
            if i is not None:
                raise self._bad("nll", f"row {i} = {nll[i - b.start]:.6g} disagrees with the log-prob of the scored "
                                       f"token, {lt[i - b.start]:.6g}")

    def _check_v2(self, targets: NDArray[Any]) -> None:
        R_all = self.lp_range.astype(np.float64)
        for b in self._blocks():
            codes, top, R = self.codes[b], self.lp_top[b].astype(np.float64), R_all[b]
            idx = np.arange(len(codes))
            i = self._row(codes[idx, self.top_id[b]] == 0, b)
            if i is not None:
                raise self._bad("top_id", f"row {i} names token {int(self.top_id[i])}, not the top one (its code "
                                          f"is {int(self.codes[i, self.top_id[i]])}, not 0)")
            cmax = codes.max(axis=1)
            # the writer's range is the row's largest distance below the top (at most LP_RANGE): the
            # farthest token is coded 65535, or the row is flat (every code 0, the range 1)
            i = self._row((cmax == _QMAX) | ((cmax == 0) & (R == 1.0)), b)
            if i is not None:
                raise self._bad("lp_range", f"row {i} = {R[i - b.start]:.6g} does not match its codes (largest "
                                            f"{int(cmax[i - b.start])}, not {_QMAX})")
            u = codes.astype(np.float64) * (1.0 / _QMAX)
            s = top + np.log(np.exp(-R[:, None] * (u * u)).sum(axis=1))
            i = self._row(np.abs(s) <= _NORM_TOL, b)
            if i is not None:
                raise FormatError(f"{self.path}: fields 'lp_codes', 'lp_top' and 'lp_range' of row {i} decode to "
                                  f"no distribution (log of its probability sum {s[i - b.start]:.6g})")
            ct = codes[idx, targets[b]]
            nll = self.nll[b]
            d = top + nll                                  # the target's distance below the top
            ut = ct.astype(np.float64) / _QMAX
            bound = (2 * np.sqrt(np.clip(d, 0, R) / R) + 1 / _QMAX) * R / (2 * _QMAX) + _NLL_TOL + 1e-6 * nll
            # a token more than LP_RANGE below the top is stored at the range: its distance is only bounded below
            ok = (np.abs(d - R * ut * ut) <= bound) | ((ct == _QMAX) & (R == LP_RANGE) & (d >= R - bound))
            i = self._row(ok, b)
            if i is not None:
                j = i - b.start
                raise self._bad("nll", f"row {i} = {nll[j]:.6g} disagrees with the coded log-prob of the scored "
                                       f"token, {top[j] - R[j] * ut[j] ** 2:.6g}")

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
                       wall_time=0.0, config=dict(model.config, add_bos=bool(add_bos)), chunk_ppl=chunk_ppl,
                       chunk_kld=[float(k.mean()) for k in kl], chunk_same_top=[float(x.mean()) for x in same])
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
