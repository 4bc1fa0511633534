"""The OpenAI-compatible API's requests and responses, without any HTTP: what a request body
may hold, its checks (an :class:`APIError` naming the field, the API's JSON error shape), and
the response and stream-chunk objects. :mod:`orkpy.server.app` serves them over HTTP.

Request fields (OpenAI's, with llama-server's extras where they apply):

- ``/v1/completions``: ``prompt`` (a string, a list of one string, token ids, or a list of one
  list of token ids);
- ``/v1/chat/completions``: ``messages`` (``role`` system / developer / user / assistant,
  ``content`` a string or a list of ``{"type": "text", "text": ...}`` parts), written in the
  model's chat template (:func:`orkpy.runtime.generate.apply_chat_template`);
- both: ``max_tokens`` (chat also ``max_completion_tokens``; llama-server's ``n_predict``, -1:
  until the context is full; default: until the context is full or an end-of-generation
  token), ``temperature`` (default 0.8), ``top_p`` (0.95), ``top_k`` (llama-server's; 40; 0: all),
  ``seed`` (default, or -1: a fresh random seed per request; the same seed, the same text),
  ``stop`` (a string or a list of strings: the text ends before the first one, which is not
  returned), ``stream`` (server-sent events), ``model`` (any string: one model is served).

Sampling is :func:`orkpy.runtime.generate.generate`'s (llama.cpp's top-k -> top-p ->
temperature order). Fields this server cannot honour are refused with 400 rather than ignored
(``n`` other than 1, ``echo``, ``logprobs``, ``best_of`` > 1, non-zero ``presence_penalty`` /
``frequency_penalty``, ``logit_bias``, ``tools``, a ``response_format`` other than text);
fields without effect on the text (``user``, ``stream_options``, ...) are accepted.
"""
from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

#: llama-server's sampling defaults (the drop-in's): temperature, top_k, top_p
DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P = 0.8, 40, 0.95
#: the message roles a chat request may use ("developer": OpenAI's newer name for system)
ROLES = ("system", "developer", "user", "assistant")
#: fields refused unless they hold their no-op value: {field: the values accepted}
UNSUPPORTED: Dict[str, tuple] = {
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "logprobs": (None, False),
    "top_logprobs": (None, 0), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}), "tools": (None, []), "functions": (None, []), "suffix": (None, ""),
}


class APIError(Exception):
    """A request the API answers with an error: ``status`` (HTTP), the error object's fields."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = int(status), message, param, code, type

    def body(self) -> Dict[str, Any]:
        """The OpenAI API's error shape."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param, code)


def parse_body(raw: bytes) -> Dict[str, Any]:
    """The request's JSON object; 400 for anything else."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


@dataclass
class Sampling:
    """A request's generation settings (module doc), checked."""
    max_tokens: Optional[int] = None  #: None: until the context is full
    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    seed: int = 0
    stop: List[str] = field(default_factory=list)
    stream: bool = False


def _number(body: Mapping[str, Any], key: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v < lo or v > hi or (lo_open and v == lo):
        side = "(" if lo_open else "["
        raise bad(f"'{key}' must be a number in {side}{lo:g}, {hi:g}], got {v!r}", key)
    return float(v)


def _int(body: Mapping[str, Any], key: str, lo: int) -> Optional[int]:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise bad(f"'{key}' must be an integer >= {lo}, got {v!r}", key)
    return v


def sampling(body: Mapping[str, Any], chat: bool) -> Sampling:
    """The checked :class:`Sampling` of a request body (400 naming the first bad field)."""
    for key, ok in UNSUPPORTED.items():
        v = body.get(key)
        if v is not None and not any(v == o and type(v) is type(o) for o in ok if o is not None):
            raise bad(f"'{key}' = {v!r} is not supported by this server (accepted: "
                      f"{', '.join(repr(o) for o in ok if o is not None) or 'null'})", key, "unsupported_parameter")
    rf = body.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
        raise bad("'response_format' other than {\"type\": \"text\"} is not supported by this server",
                  "response_format", "unsupported_parameter")
    keys = ["max_tokens"] + (["max_completion_tokens"] if chat else [])
    given = [k for k in keys if body.get(k) is not None]
    max_tokens = _int(body, given[-1], 0) if given else None
    if max_tokens is None and body.get("n_predict") is not None:
        n = _int(body, "n_predict", -1)
        max_tokens = None if n == -1 else n
    seed = body.get("seed")
    if seed is None or seed == -1:
        seed = secrets.randbelow(2**63)
    elif isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise bad(f"'seed' must be an integer >= 0 (or -1: random), got {seed!r}", "seed")
    stop = body.get("stop")
    if stop is None:
        stops: List[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise bad(f"'stop' must be a string or a list of strings, got {stop!r}", "stop")
    top_k = _int(body, "top_k", 0)
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise bad(f"'stream' must be true or false, got {stream!r}", "stream")
    return Sampling(max_tokens=max_tokens, temperature=_number(body, "temperature", DEFAULT_TEMPERATURE, 0.0, 1e9),
                    top_k=DEFAULT_TOP_K if top_k is None else top_k,
                    top_p=_number(body, "top_p", DEFAULT_TOP_P, 0.0, 1.0, lo_open=True), seed=int(seed),
                    stop=[s for s in stops if s], stream=bool(stream))


def completion_prompt(body: Mapping[str, Any]) -> Union[str, List[int]]:
    """A completions request's prompt: text, or token ids (400 for anything else)."""
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # one prompt in a list (what the openai client sends for a batch of one)
    if isinstance(p, str):
        if not p:
            raise bad("'prompt' is empty", "prompt")
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return [int(t) for t in p]
    if isinstance(p, list) and len(p) > 1:
        raise bad("'prompt' holds several prompts: this server answers one per request", "prompt")
    raise bad(f"'prompt' must be a non-empty string or a list of token ids, got {p!r}"[:200], "prompt")


def _content(m: Mapping[str, Any], i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for part in c:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad(f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) are "
                          f"supported, got {part!r}"[:200], f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    if c is None and m.get("role") == "assistant":
        return ""
    raise bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def chat_messages(body: Mapping[str, Any]) -> List[Dict[str, str]]:
    """A chat request's messages as [{role, content}] (developer -> system; 400 for anything else)."""
    ms = body.get("messages")
    if not isinstance(ms, list) or not ms:
        raise bad("'messages' must be a non-empty list of messages", "messages")
    out = []
    for i, m in enumerate(ms):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object with 'role' and 'content'", f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", f"messages[{i}].role")
        out.append({"role": "system" if role == "developer" else str(role), "content": _content(m, i)})
    return out


# ------------------------------------------------------------ responses --
def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(prompt_tokens: int, completion_tokens: int) -> Dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(rid: str, model: str, text: str, finish: Optional[str], use: Optional[Dict[str, int]],
               chunk: bool = False) -> Dict[str, Any]:
    """A ``text_completion`` object (one stream chunk when ``chunk``)."""
    out: Dict[str, Any] = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
                           "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
    if use is not None:
        out["usage"] = use
    return out


def chat_completion(rid: str, model: str, text: str, finish: Optional[str], use: Dict[str, int]) -> Dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish}],
            "usage": use}


def chat_chunk(rid: str, model: str, delta: Dict[str, str], finish: Optional[str],
               use: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    out: Dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                           "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    if use is not None:
        out["usage"] = use
    return out


def sse(obj: Union[Dict[str, Any], str]) -> bytes:
    """One server-sent event: ``data: <json>`` (or the literal ``[DONE]``) and a blank line."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode("utf-8")


__all__ = ["APIError", "DEFAULT_TEMPERATURE", "DEFAULT_TOP_K", "DEFAULT_TOP_P", "ROLES", "Sampling", "UNSUPPORTED",
           "chat_chunk", "chat_completion", "chat_messages", "completion", "completion_prompt", "new_id",
           "parse_body", "sampling", "sse", "usage"]
