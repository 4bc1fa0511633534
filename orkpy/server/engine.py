"""The server's generation: one request's continuation (:class:`Job`: the prompt's tokens, the
context limit, stop sequences, token counts, why it ended) and the queue that runs one request
at a time on the model (:class:`Engine`), without HTTP.

A :class:`Job` is synchronous and runs on a worker thread, a step (one token's text) at a time,
so the event loop can stop it between two steps: a client that disconnects mid-stream stops
its generation within one token (the step in flight finishes; the rest never runs). The
model's KV-cached session is per request (``n_ctx`` = the prompt's tokens + ``max_tokens``, at
most the server's context), so queued requests never see each other's cache.

Stop sequences (:class:`StopScanner`): the text ends before the first occurrence of any of them,
also when one spans several tokens; while streaming, text that could still be the start of a
stop sequence is held back until the next token decides it (llama-server does the same).
"""
from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from .protocol import APIError, Sampling, bad

#: how many finished requests :attr:`Engine.history` keeps
HISTORY = 64


class StopScanner:
    """Cuts a text stream at the first occurrence of any of ``stops`` (non-empty strings)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.buf = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        """The text of ``piece`` (after what was held back) that is now final; sets
        :attr:`stopped` when a stop sequence was found (what follows it is dropped)."""
        if self.stopped:
            return ""
        if not self.stops:
            return piece
        self.buf += piece
        hits = [i for i in (self.buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.buf, self.stopped = self.buf[:min(hits)], "", True
            return out
        keep = 0  # the longest end of the buffer that is the start of a stop sequence
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.buf)), keep, -1):
                if self.buf.endswith(s[:k]):
                    keep = k
                    break
        out = self.buf[:len(self.buf) - keep]
        self.buf = self.buf[len(self.buf) - keep:]
        return out

    def flush(self) -> str:
        """What was held back (the generation ended without completing a stop sequence)."""
        out, self.buf = ("" if self.stopped else self.buf), ""
        return out


class Job:
    """One request's generation (module doc): :meth:`start` evaluates the prompt, :meth:`step`
    returns the next piece of text ("" possible) or None when it has ended; then
    :attr:`finish_reason` is "stop" (an end-of-generation token or a stop sequence) or "length"
    (``max_tokens``, or the context full), and :attr:`completion_tokens` the tokens sampled."""

    def __init__(self, model: Any, ids: Sequence[int], s: Sampling, n_ctx: int, threads: Optional[int]) -> None:
        self.model, self.ids, self.s, self.threads = model, np.asarray(ids, np.int32), s, threads
        n = len(self.ids)
        if n == 0:
            raise bad("the prompt has no tokens", "prompt")
        if s.max_tokens is None:  # until the context is full (the last token is sampled, never evaluated)
            if n >= n_ctx:
                raise context_error(n, None, n_ctx)
            self.max_tokens = n_ctx - n + 1
        else:
            self.max_tokens = s.max_tokens
            if n + max(self.max_tokens - 1, 0) > n_ctx:
                raise context_error(n, self.max_tokens, n_ctx)
        self.stats: Dict[str, Any] = {}
        self.scanner = StopScanner(s.stop)
        self.finish_reason: Optional[str] = None
        self._it: Optional[Iterator[str]] = None
        self._done = False

    @property
    def prompt_tokens(self) -> int:
        return int(len(self.ids))

    @property
    def completion_tokens(self) -> int:
        return int(self.stats.get("n_gen", 0))

    def start(self) -> None:
        from ..runtime.generate import generate
        s = self.s
        it = generate(self.model, self.ids, self.max_tokens, s.temperature, s.top_k, s.top_p, s.seed, stream=True,
                      threads=self.threads, n_ctx=max(len(self.ids) + max(self.max_tokens - 1, 0), 1),
                      stats=self.stats)
        assert not isinstance(it, str)
        self._it = it

    def step(self) -> Optional[str]:
        if self._done:
            return None
        assert self._it is not None, "start() first"
        piece = next(self._it, None)
        if piece is None:
            self._done = True
            self.finish_reason = "stop" if self.stats.get("stop") == "eog" else "length"
            rest = self.scanner.flush()
            return rest or None
        out = self.scanner.push(piece)
        if self.scanner.stopped:
            self._done = True
            self.finish_reason = "stop"
            self.close()
        return out

    def close(self) -> None:
        """Stop generating (the session and its KV cache go with the generator)."""
        it, self._it = self._it, None
        if it is not None and hasattr(it, "close"):
            it.close()

    def run(self) -> str:
        """The whole text (the non-streaming answer)."""
        self.start()
        out: List[str] = []
        while True:
            piece = self.step()
            if piece is None:
                break
            out.append(piece)
        return "".join(out)


def context_error(n_prompt: int, max_tokens: Optional[int], n_ctx: int) -> APIError:
    if max_tokens is None:
        msg = f"the prompt has {n_prompt} tokens, which leaves no room in the context of {n_ctx} tokens"
    else:
        msg = (f"the prompt ({n_prompt} tokens) and max_tokens {max_tokens} need "
               f"{n_prompt + max(max_tokens - 1, 0)} positions, more than the context of {n_ctx} tokens")
    return APIError(400, msg, "max_tokens" if max_tokens is not None else "prompt", "context_length_exceeded")


class Engine:
    """The served model and its queue: requests run one at a time, in arrival order (an asyncio
    lock: FIFO), each step of a job on a worker thread. ``n_ctx``: the context limit of a request
    (prompt + generated tokens). :attr:`history` records the last :data:`HISTORY` requests
    (``id``, ``prompt_tokens``, ``completion_tokens``, ``finish_reason``: "stop", "length", or
    "cancelled" for a client gone mid-stream; ``seconds``)."""

    def __init__(self, model: Any, n_ctx: int, threads: Optional[int] = None) -> None:
        self.model, self.n_ctx, self.threads = model, int(n_ctx), threads
        self._lock: Optional[asyncio.Lock] = None
        self.history: Deque[Dict[str, Any]] = collections.deque(maxlen=HISTORY)
        self.active = 0  # requests holding or waiting for the model

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:  # made in the server's event loop
            self._lock = asyncio.Lock()
        return self._lock

    def prompt_ids(self, prompt: Union[str, Sequence[int]]) -> List[int]:
        """Token ids of a completion prompt (text: BOS as the vocabulary says) checked against the vocabulary."""
        if isinstance(prompt, str):
            return [int(t) for t in self.model.tokens(prompt)]
        nv = int(self.model.n_vocab)
        badt = [t for t in prompt if not 0 <= t < nv]
        if badt:
            raise bad(f"'prompt' token id {badt[0]} is outside the vocabulary (0 .. {nv - 1})", "prompt")
        return list(prompt)

    def chat_ids(self, messages: List[Dict[str, str]]) -> List[int]:
        """Token ids of chat ``messages`` in the model's chat template, the assistant's turn opened."""
        from ..runtime.generate import apply_chat_template, chat_template_kind
        try:
            kind = chat_template_kind(self.model.chat_template, "the served model")
        except ValueError as e:
            raise bad(f"{e} (use /v1/completions)", "messages", "no_chat_template") from None
        text = apply_chat_template(kind, messages)
        return [int(t) for t in self.model.tokenizer.encode(text, add_special=True, parse_special=True)]

    def job(self, ids: Sequence[int], s: Sampling) -> Job:
        return Job(self.model, ids, s, self.n_ctx, self.threads)

    def record(self, rid: str, job: Job, t0: float, cancelled: bool = False) -> None:
        self.history.append({"id": rid, "prompt_tokens": job.prompt_tokens, "completion_tokens": job.completion_tokens,
                             "finish_reason": "cancelled" if cancelled else job.finish_reason,
                             "seconds": round(time.perf_counter() - t0, 4)})


__all__ = ["Engine", "HISTORY", "Job", "StopScanner", "context_error"]
