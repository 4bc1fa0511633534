"""orkpy's OpenAI-compatible server (``orkpy serve MODEL``; the ``serve`` extra: Starlette + uvicorn).

:mod:`orkpy.server.protocol` (requests, responses, errors) and :mod:`orkpy.server.engine`
(generation, stop sequences, the queue) need no HTTP library; :func:`create_app`
(:mod:`orkpy.server.app`) is the ASGI application and needs the extra.
"""
from typing import Any

__all__ = ["create_app", "MISSING_EXTRA"]

#: what a user without the extra is told
MISSING_EXTRA = "the server needs the 'serve' extra: pip install 'orkpy[serve]' (Starlette and uvicorn)"


def create_app(*args: Any, **kw: Any) -> Any:
    """:func:`orkpy.server.app.create_app` (ImportError naming the extra when it is not installed)."""
    try:
        from .app import create_app as make
    except ImportError as e:
        raise ImportError(f"{MISSING_EXTRA}; {e}") from e
    return make(*args, **kw)
