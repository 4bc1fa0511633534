"""The OpenAI-compatible HTTP server (``orkpy serve MODEL``): a Starlette application, served by
uvicorn -- both the optional extra ``pip install 'orkpy[serve]'`` (the ASGI stack llama-cpp-python's
own server uses: maintained, small, streaming with disconnect detection; no hand-written HTTP).

Routes (also without the ``/v1`` prefix, as llama-server answers them):

- ``GET /v1/models``: the one model served (``id``: ``--alias``, default the model's file name);
- ``POST /v1/completions``, ``POST /v1/chat/completions``: :mod:`orkpy.server.protocol`'s
  requests; ``"stream": true`` answers with server-sent events (``data: {chunk}`` ... ``data:
  [DONE]``);
- ``GET /health``: ``{"status": "ok"}``.

Errors are the OpenAI API's JSON error object (``{"error": {"message", "type", "param",
"code"}}``): 400 for a bad request (a field named), 401 without the ``--api-key`` when one is
set, 404 / 405 for an unknown route or method, 500 for a failure of the server itself. Requests
are queued and run one at a time (:class:`orkpy.server.engine.Engine`); a client that
disconnects stops its generation within one token.
"""
from __future__ import annotations

import time
from typing import Any, AsyncIterator, Dict, Optional

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import protocol as P
from .engine import Engine, Job


def _error(e: P.APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


class _Api:
    """The route handlers over one :class:`Engine`."""

    def __init__(self, engine: Engine, alias: str, api_key: Optional[str]) -> None:
        self.engine, self.alias, self.api_key = engine, alias, api_key
        self.created = int(time.time())

    def _auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        got = request.headers.get("authorization", "")
        if got != f"Bearer {self.api_key}":
            raise P.APIError(401, "a valid API key is needed (Authorization: Bearer KEY)", None, "invalid_api_key",
                             "authentication_error")

    async def models(self, request: Request) -> Response:
        self._auth(request)
        return JSONResponse({"object": "list", "data": [{"id": self.alias, "object": "model", "created": self.created,
                                                          "owned_by": "orkpy"}]})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _body(self, request: Request) -> Dict[str, Any]:
        self._auth(request)
        return P.parse_body(await request.body())

    async def completions(self, request: Request) -> Response:
        body = await self._body(request)
        s = P.sampling(body, chat=False)
        ids = self.engine.prompt_ids(P.completion_prompt(body))
        return await self._answer(request, self.engine.job(ids, s), chat=False)

    async def chat(self, request: Request) -> Response:
        body = await self._body(request)
        s = P.sampling(body, chat=True)
        ids = self.engine.chat_ids(P.chat_messages(body))
        return await self._answer(request, self.engine.job(ids, s), chat=True)

    async def _answer(self, request: Request, job: Job, chat: bool) -> Response:
        rid = P.new_id("chatcmpl" if chat else "cmpl")
        if job.s.stream:
            return StreamingResponse(self._events(request, job, rid, chat), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        t0 = time.perf_counter()
        self.engine.active += 1
        try:
            async with self.engine.lock:
                text = await anyio.to_thread.run_sync(job.run)
        finally:
            self.engine.active -= 1
            job.close()
        self.engine.record(rid, job, t0)
        use = P.usage(job.prompt_tokens, job.completion_tokens)
        if chat:
            return JSONResponse(P.chat_completion(rid, self.alias, text, job.finish_reason, use))
        return JSONResponse(P.completion(rid, self.alias, text, job.finish_reason, use))

    async def _events(self, request: Request, job: Job, rid: str, chat: bool) -> AsyncIterator[bytes]:
        """The stream of one request; cancelled (Starlette's disconnect watch) or stopped by a
        disconnect seen between two tokens, the generation ends there."""
        t0 = time.perf_counter()
        cancelled = True
        self.engine.active += 1
        try:
            async with self.engine.lock:
                await anyio.to_thread.run_sync(job.start)
                if chat:
                    yield P.sse(P.chat_chunk(rid, self.alias, {"role": "assistant", "content": ""}, None))
                while True:
                    piece = await anyio.to_thread.run_sync(job.step)
                    if piece is None:
                        break
                    if piece:
                        yield P.sse(P.chat_chunk(rid, self.alias, {"content": piece}, None) if chat
                                    else P.completion(rid, self.alias, piece, None, None, chunk=True))
                    if await request.is_disconnected():
                        return
                use = P.usage(job.prompt_tokens, job.completion_tokens)
                yield P.sse(P.chat_chunk(rid, self.alias, {}, job.finish_reason, use) if chat
                            else P.completion(rid, self.alias, "", job.finish_reason, use, chunk=True))
                yield P.sse("[DONE]")
                cancelled = False
        except (P.APIError, ValueError) as e:  # after the headers went: the error as an event
            cancelled = False
            err = e if isinstance(e, P.APIError) else P.APIError(400, str(e))
            yield P.sse(err.body())
        finally:
            self.engine.active -= 1
            job.close()
            self.engine.record(rid, job, t0, cancelled=cancelled)


def create_app(model: Any, alias: Optional[str] = None, n_ctx: Optional[int] = None, threads: Optional[int] = None,
               api_key: Optional[str] = None) -> Starlette:
    """The server's ASGI application for a loaded model (:func:`orkpy.load_model`'s result).
    ``n_ctx``: a request's context limit (default: the model's training context, at most 4096 --
    llama-server's default); ``alias``: the model id (default: the model file's name);
    ``api_key``: when set, every request but ``/health`` needs ``Authorization: Bearer KEY``.
    ``app.state.engine`` is the :class:`Engine` (its ``history``)."""
    import os
    if n_ctx is None:
        train = int(getattr(model, "hparams", {}).get("n_ctx_train", 0) or 0)
        n_ctx = min(train, 4096) if train > 0 else 4096
    if int(n_ctx) < 1:
        raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
    engine = Engine(model, int(n_ctx), threads)
    api = _Api(engine, alias or os.path.basename(str(model.path)), api_key)

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, P.APIError)
        return _error(exc)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        msg = (f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405)
               else str(exc.detail))
        return _error(P.APIError(exc.status_code, msg, None, None, kind))

    async def on_other(request: Request, exc: Exception) -> Response:
        return _error(P.APIError(500, f"the server failed: {type(exc).__name__}: {exc}", None, None, "server_error"))

    routes = []
    for prefix in ("/v1", ""):
        routes += [Route(f"{prefix}/models", api.models, methods=["GET"]),
                   Route(f"{prefix}/completions", api.completions, methods=["POST"]),
                   Route(f"{prefix}/chat/completions", api.chat, methods=["POST"])]
    routes.append(Route("/health", api.health, methods=["GET"]))
    app = Starlette(routes=routes, exception_handlers={P.APIError: on_api_error, HTTPException: on_http,
                                                       Exception: on_other})
    app.state.engine = engine
    return app


__all__ = ["create_app"]
