"""Text generation: a KV-cached decode session, sampling, chat prompts.

:class:`Session` (``Model.session(n_ctx)``) is the C decode session of csrc/ork/model.h: every
layer's keys and values (float32, ``n_ctx`` positions) cached once computed, so a prompt is
evaluated as one batch and each new token costs one step with M = 1 (every linear a GEMV on its
own weight path: float32, int8, NF4, ... and NPU routes alike). ``eval(tokens)`` appends tokens
and returns the logits of the last one (or of every one); they equal the rows of
``Model.forward`` over the whole sequence bit for bit (the F32 path, and packed linears with
per-token or static activations; see the header for per-tensor scales).

:func:`generate` (``Model.generate``) samples a continuation of a prompt:

- ``temperature=0``: greedy (the first largest logit, as llama.cpp's greedy sampler);
- otherwise llama.cpp's chain order: the ``top_k`` largest logits (0: all), then the smallest
  set of them whose probabilities (softmax at temperature 1) sum to at least ``top_p``, then
  softmax of the survivors' logits / ``temperature``, one draw from
  ``numpy.random.default_rng(seed)`` -- the same seed gives the same text.

Generation stops after ``max_tokens`` tokens or at an end-of-generation token
(``Tokenizer.eog_ids``: EOS, EOT, ``<|im_end|>``, ``<end_of_turn>``, ...), which is not part of
the text. The text is ``Tokenizer.decode(ids, continuation=True)`` of the generated ids (the
leading space kept: it continues the prompt); ``stream=True`` yields it piece by piece as it
becomes final (:class:`~orkpy.runtime.tokenizer.TextStream`), the pieces joining to the same string.

Chat prompts (``chat=True``, ``orkpy generate --chat``): the prompt is one user message in the
GGUF's ``tokenizer.chat_template``, which is recognised by its markers the way llama.cpp's
``llm_chat_detect_template`` does (no Jinja) and written as llama.cpp's built-in templates
write it: ``chatml`` (``<|im_start|>``), ``gemma`` (``<start_of_turn>``; a system message joins
the first user turn) and ``llama3`` (``<|start_header_id|>``). The template's own default system
prompt, if its Jinja code has one, is not added (llama.cpp's built-in templates do not either).
The text is tokenized with the control tokens parsed (``parse_special``) and BOS as the
vocabulary says. Any other template, or none, is a ValueError naming the file.
"""
from __future__ import annotations

import math
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Protocol, Sequence, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core
from .tokenizer import Tokenizer

__all__ = ["Session", "generate", "sample_token", "chat_template_kind", "apply_chat_template", "CHAT_TEMPLATES"]

#: the chat templates :func:`apply_chat_template` writes (llama.cpp's names)
CHAT_TEMPLATES = ("chatml", "gemma", "llama3")


def check_session_args(n_ctx: int, n_batch: int) -> None:
    """ValueError unless both are ints >= 1."""
    for name, v in (("n_ctx", n_ctx), ("n_batch", n_batch)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")


class Session:
    """A KV-cached decode session (``Model.session(n_ctx, n_batch)``, which makes the C session
    ``core``): ``eval(tokens)`` appends tokens and returns float32 logits of the last one
    (``all_logits=True``: ``(n, n_vocab)``, one row per appended token); ``pos`` tokens held,
    ``tokens`` their ids; ``rewind(pos)`` forgets the positions from ``pos`` on. The caches
    (2 x n_layer x n_ctx x n_head_kv x head_dim float32) and the scratch for ``n_batch``
    tokens per step are allocated once, when it is made. Appending past ``n_ctx`` is a
    ValueError naming it (the session is then unchanged). Threads may share a session: every
    ``eval`` / ``rewind`` is one step under the model's lock, and ``tokens`` always lists the ids
    the cache holds in the cache's order (docs/security.md)."""

    def __init__(self, core: _core.Session) -> None:
        self._core = core

    @property
    def pos(self) -> int:
        return self._core.pos

    @property
    def n_ctx(self) -> int:
        return self._core.n_ctx

    @property
    def tokens(self) -> List[int]:
        """The ids of the positions held, in order (a new list). The core records them under the
        model's lock in the step that fills the KV cache, so with threads sharing the session they
        are always the ids the cache holds, in its order."""
        return self._core.tokens

    def eval(self, tokens: ArrayLike, all_logits: bool = False, threads: Optional[int] = None) -> NDArray[np.float32]:
        t = np.atleast_1d(np.asarray(tokens))
        return self._core.eval(t, bool(all_logits), 0 if threads is None else int(threads))

    def rewind(self, pos: int) -> None:
        self._core.rewind(int(pos))

    def __repr__(self) -> str:
        return f"Session(pos={self.pos}, n_ctx={self.n_ctx})"


class GenModel(Protocol):
    """What :func:`generate` uses of a model (an :class:`orkpy.Model`)."""

    path: str

    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def chat_template(self) -> Optional[str]: ...
    def tokens(self, text_or_tokens: Union[str, ArrayLike], add_bos: Optional[bool] = None) -> NDArray[np.int32]: ...
    def session(self, n_ctx: int, n_batch: int = 512) -> Session: ...


# ------------------------------------------------------------------- sampling --
def check_sampling(max_tokens: int, temperature: float, top_k: int, top_p: float, seed: int) -> None:
    """ValueError naming the first bad sampling argument."""
    if not isinstance(max_tokens, (int, np.integer)) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise ValueError(f"max_tokens must be an int >= 0, got {max_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.floating, np.integer)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0: every token), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float, np.floating, np.integer)) \
            or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")


def sample_token(logits: ArrayLike, rng: np.random.Generator, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95) -> int:
    """One token id from ``logits`` (1-D) by the rules of the module doc."""
    lg = np.asarray(logits)
    if temperature == 0:
        return int(np.argmax(lg))
    x = lg.astype(np.float64)
    n = x.size
    idx = np.argpartition(-x, top_k - 1)[:top_k] if 0 < top_k < n else np.arange(n)
    idx = idx[np.lexsort((idx, -x[idx]))]   # largest first, ties by id
    cand = x[idx]
    if top_p < 1.0:
        p = np.exp(cand - cand[0])
        keep = int(np.searchsorted(np.cumsum(p / p.sum()), top_p)) + 1   # the smallest prefix reaching top_p
        idx, cand = idx[:keep], cand[:keep]
    p = np.exp((cand - cand[0]) / float(temperature))
    return int(idx[rng.choice(len(p), p=p / p.sum())])


# --------------------------------------------------------------- chat prompts --
def chat_template_kind(template: Optional[str], where: str = "the model") -> str:
    """The built-in template (:data:`CHAT_TEMPLATES`) a GGUF ``tokenizer.chat_template`` is, by
    llama.cpp's markers; ValueError for none or another one."""
    if not template:
        raise ValueError(f"{where} has no chat template (tokenizer.chat_template): give a plain prompt")
    if "<|im_start|>" in template:
        if "<|im_sep|>" in template or "<end_of_utterance>" in template:
            raise ValueError(f"{where}: its chat template is a ChatML variant (phi4 / smolvlm) that orkpy does not "
                             f"write; supported: {', '.join(CHAT_TEMPLATES)}")
        return "chatml"
    if "<start_of_turn>" in template:
        return "gemma"
    if "<|start_header_id|>" in template and "<|end_header_id|>" in template:
        return "llama3"
    raise ValueError(f"{where}: unsupported chat template (supported: {', '.join(CHAT_TEMPLATES)}, recognised by "
                     f"<|im_start|>, <start_of_turn>, <|start_header_id|>); starts {template[:60]!r}")


def _trim(s: str) -> str:
    return s.strip(" \t\n\v\f\r")   # llama.cpp's trim: ASCII whitespace


def apply_chat_template(kind: str, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
    """``messages`` (dicts with ``role`` and ``content``) as the text of template ``kind``, with
    the assistant's turn opened when ``add_generation_prompt`` (llama.cpp's built-ins)."""
    if kind not in CHAT_TEMPLATES:
        raise ValueError(f"unknown chat template {kind!r} (expected one of {', '.join(CHAT_TEMPLATES)})")
    out: List[str] = []
    system = ""
    for m in messages:
        role, content = m["role"], m["content"]
        if kind == "chatml":
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif kind == "llama3":
            out.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{_trim(content)}<|eot_id|>")
        else:  # gemma: no system turn, a system message joins the next user turn
            if role == "system":
                system += _trim(content)
                continue
            role = "model" if role == "assistant" else role
            out.append(f"<start_of_turn>{role}\n")
            if system and role != "model":
                out.append(system + "\n\n")
                system = ""
            out.append(f"{_trim(content)}<end_of_turn>\n")
    if add_generation_prompt:
        out.append({"chatml": "<|im_start|>assistant\n", "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
                    "gemma": "<start_of_turn>model\n"}[kind])
    return "".join(out)


def prompt_tokens(model: GenModel, prompt: Union[str, ArrayLike], chat: bool = False) -> NDArray[np.int32]:
    """The prompt's token ids: a str tokenized by the model (BOS as the vocabulary says; with
    ``chat``, as one user message in the model's chat template), an int array as given."""
    if not chat:
        return model.tokens(prompt)
    if not isinstance(prompt, str):
        raise TypeError("chat=True needs the prompt as a str (the user's message)")
    kind = chat_template_kind(model.chat_template, model.path)
    text = apply_chat_template(kind, [{"role": "user", "content": prompt}])
    return model.tokenizer.encode(text, add_special=True, parse_special=True)


# ------------------------------------------------------------------ generate --
def _ids(sess: Session, first_logits: NDArray[np.float32], max_tokens: int, eog: frozenset, rng: np.random.Generator,
         temperature: float, top_k: int, top_p: float, threads: Optional[int], stats: Dict[str, Any]) -> Iterator[int]:
    logits = first_logits
    for i in range(max_tokens):
        tok = sample_token(logits, rng, temperature, top_k, top_p)
        if tok in eog:
            stats["stop"] = "eog"
            break
        stats["n_gen"] = i + 1
        yield tok
        if i + 1 < max_tokens:
            t0 = time.perf_counter()
            logits = sess.eval(np.array([tok], dtype=np.int32), threads=threads)
            stats["t_decode"] += time.perf_counter() - t0
            stats["n_decode"] += 1
    else:
        stats["stop"] = "max_tokens"


def generate(model: GenModel, prompt: Union[str, ArrayLike], max_tokens: int = 128, temperature: float = 0.8,
             top_k: int = 40, top_p: float = 0.95, seed: int = 0, stream: bool = False, *, chat: bool = False,
             threads: Optional[int] = None, n_ctx: Optional[int] = None, n_batch: int = 512,
             stats: Optional[Dict[str, Any]] = None) -> Union[str, Iterator[str]]:
    """The continuation of ``prompt`` (a str, or token ids) by ``model``: a str, or with
    ``stream`` an iterator of its pieces as they come (module doc). The arguments are checked
    and the prompt evaluated before this returns, also when streaming. ``n_ctx``: the
    session's positions (default: the prompt's tokens + ``max_tokens``; too few for them is a
    ValueError). ``stats``, a dict, receives n_prompt, t_prompt (s: the prompt's eval), n_gen
    (tokens generated), n_decode and t_decode (the one-token evals and their seconds) and stop
    ("eog" or "max_tokens")."""
    check_sampling(max_tokens, temperature, top_k, top_p, seed)
    ids = prompt_tokens(model, prompt, chat)
    if len(ids) == 0:
        raise ValueError("the prompt has no tokens (an empty text and a vocabulary that adds no BOS)")
    need = len(ids) + max(int(max_tokens) - 1, 0)   # the last token is sampled, never evaluated
    if n_ctx is None:
        n_ctx = max(need, 1)
    elif need > n_ctx:
        raise ValueError(f"the prompt ({len(ids)} tokens) and max_tokens {max_tokens} need {need} positions, more "
                         f"than n_ctx {n_ctx}")
    st: Dict[str, Any] = stats if stats is not None else {}
    st.update(n_prompt=len(ids), n_gen=0, n_decode=0, t_decode=0.0, stop=None)
    tok = model.tokenizer
    text = tok.stream(continuation=True)
    if max_tokens == 0:
        st.update(t_prompt=0.0, stop="max_tokens")
        return iter(()) if stream else ""
    sess = model.session(n_ctx, n_batch)
    t0 = time.perf_counter()
    first = sess.eval(ids, threads=threads)
    st["t_prompt"] = time.perf_counter() - t0
    gen = _ids(sess, first, int(max_tokens), tok.eog_ids, np.random.default_rng(int(seed)), float(temperature),
               int(top_k), float(top_p), threads, st)
    if not stream:
        out = [text.push(t) for t in gen]
        return "".join(out) + text.flush()

    def pieces() -> Iterator[str]:
        for t in gen:
            piece = text.push(t)
            if piece:
                yield piece
        rest = text.flush()
        if rest:
            yield rest
    return pieces()
