"""Guarded file mappings (the contract is in docs/security.md).

orkpy maps files with :class:`orkpy._core.MappedFile`: the whole file,
read-only, registered with a SIGBUS guard (csrc/ork/mapguard.h), so that a
read past the end of a file another process truncated reads zeros instead of
killing the process, and ``check()`` raises :class:`orkpy.FormatError` naming
the file ("... changed size while mapped: was N bytes, now M"). Every orkpy
entry point that reads mapped data checks the files it reads before and after
(:func:`guarded`), so it either returns the answer for the file as opened or
raises.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator, List, Optional, Tuple

from ._core import MappedFile

__all__ = ["MappedFile", "maps_of", "check", "guarded"]

_MAX_CHAIN = 64  # base chains are short (array -> array -> memoryview -> MappedFile)


def _map_of(obj: Any) -> Optional[MappedFile]:
    for _ in range(_MAX_CHAIN):
        if isinstance(obj, MappedFile):
            return obj
        if isinstance(obj, memoryview):
            obj = obj.obj
        else:
            obj = getattr(obj, "base", None)
        if obj is None:
            return None
    return None


def maps_of(*objs: Any) -> Tuple[MappedFile, ...]:
    """The distinct MappedFiles that arrays (or MappedFiles) in ``objs`` view, in order."""
    out: List[MappedFile] = []
    for o in objs:
        m = _map_of(o)
        if m is not None and not any(m is x for x in out):
            out.append(m)
    return tuple(out)


def check(maps: Iterable[MappedFile]) -> None:
    """FormatError naming the first file that changed while mapped."""
    for m in maps:
        m.check()


@contextmanager
def guarded(maps: Tuple[MappedFile, ...]) -> Iterator[None]:
    """Check ``maps`` before and after the block. A change during the block
    raises FormatError even when the block raised something else (a read
    that saw zeros can fail in any way), chained to that error."""
    check(maps)
    try:
        yield
    except BaseException as e:
        try:
            check(maps)
        except Exception as changed:
            raise changed from e
        raise
    check(maps)
