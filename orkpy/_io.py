"""File I/O shared by every module: atomic file writing (a temp file in the
target's folder, fsync, rename: a crash mid-write never leaves a half file under
the final name; every writer, thread or process, has its own temp name, so
concurrent saves to one path end with one writer's complete file), reading a
text as llama.cpp's tools do, SHA-256 of files, and progress reports (a live
bar on a terminal, sparse plain lines otherwise)."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import stat
import secrets
import sys
import threading
import time
from typing import Any, BinaryIO, Callable, Dict, Iterable, Iterator, Union

from ._typing import StrPath


def json_finite_float(text: str) -> float:
    """``json.loads(parse_float=...)``: a JSON number literal too large for a double (``1e999``) is
    refused (ValueError) instead of read as infinity, which no orkpy writer could write back."""
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text[:40]} is out of the range of a double")
    return v


def temp_sibling(path: str) -> str:
    """A fresh name next to ``path`` for a temp file or folder, unique per writer:
    ``.<name>.tmp-<pid>-<thread>-<random>`` (the name cut to 100 bytes to stay within
    NAME_MAX). The caller creates it exclusively (O_EXCL / mkdir), retrying on FileExistsError."""
    d, base = os.path.split(path)
    base = os.fsdecode(os.fsencode(base)[:100])
    return os.path.join(d, f".{base}.tmp-{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}")


def fsync_dir(d: str) -> None:
    """Make a rename in folder ``d`` durable (best effort: some file systems refuse)."""
    try:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


DIRECT_ALIGN = 4096      #: O_DIRECT: buffer address, file offset and length are multiples of this
DIRECT_STAGE = 4 << 20   #: the page-aligned staging buffer of a direct write
DIRECT_MIN = 1 << 20     #: a file shorter than this is written through the page cache


_STAGE = threading.local()  # each writing thread's staging buffer, kept: its pages stay resident


class _DirectWriter:
    """Write chunks to the new file ``fd`` past the page cache (O_DIRECT, set and cleared with
    fcntl as each write needs): the bytes pass through a page-aligned staging buffer of
    DIRECT_STAGE bytes (one per thread, reused), each full one written at once; the last is padded
    with zeros to DIRECT_ALIGN and the file cut back to its length. The first ``head`` bytes
    (rounded up to DIRECT_ALIGN: a file's header, which a reader parses right away) go through the
    page cache, and so does all of a file shorter than DIRECT_MIN, or every byte when the file
    system refuses O_DIRECT or the first direct write (EINVAL: tmpfs before Linux 6.6, some network
    and overlay file systems)."""

    def __init__(self, fd: int, head: int) -> None:
        import mmap
        view = getattr(_STAGE, "view", None)
        if view is None:
            view = _STAGE.view = memoryview(mmap.mmap(-1, DIRECT_STAGE))  # anonymous: page-aligned
        self.fd, self.view = fd, view
        self.head = -(-head // DIRECT_ALIGN) * DIRECT_ALIGN
        self.direct_ok = True  # False once the file system refused O_DIRECT
        self.total = 0         # bytes written (padding excluded)

    def set_direct(self, on: bool) -> None:
        import fcntl
        fl = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        want = fl | os.O_DIRECT if on else fl & ~os.O_DIRECT
        if want != fl:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, want)

    def limit(self) -> int:
        """bytes the stage may hold before the next flush: the head ends a flush of its own"""
        return min(self.head - self.total, DIRECT_STAGE) if self.total < self.head else DIRECT_STAGE

    def flush(self, n: int, last: bool) -> None:
        """write the stage's first n bytes (``last``: the file's end)"""
        view = self.view
        direct = self.direct_ok and self.total >= self.head and not (last and self.total + n < DIRECT_MIN)
        while True:
            m = n
            if direct and n % DIRECT_ALIGN:
                m = n + DIRECT_ALIGN - n % DIRECT_ALIGN
                view[n:m] = bytes(m - n)
            off = 0
            try:
                self.set_direct(direct)  # F_SETFL refuses O_DIRECT (EINVAL) where the file system has no direct I/O
                while off < m:
                    off += os.write(self.fd, view[off:m])
            except OSError as e:
                if not (direct and e.errno == errno.EINVAL and off == 0 and self.total == self.head):
                    raise
                self.direct_ok = direct = False  # refused: this and every later byte through the page cache
                continue
            break
        self.total += n
        if m != n:  # the padded tail: the file ends at the last byte written
            os.ftruncate(self.fd, self.total)

    def write_all(self, chunks: Iterable[Union[bytes, bytearray, memoryview]]) -> None:
        view = self.view
        fill, limit = 0, self.limit()
        for c in chunks:
            mv = memoryview(c).cast("B")
            i = 0
            while i < len(mv):
                k = min(len(mv) - i, limit - fill)
                view[fill:fill + k] = mv[i:i + k]
                fill += k
                i += k
                if fill == limit:
                    self.flush(fill, False)
                    fill, limit = 0, self.limit()
            mv.release()
        if fill or self.total == 0:
            self.flush(fill, True)


def _write_direct(fd: int, chunks: Iterable[Union[bytes, bytearray, memoryview]], head: int = 0) -> None:
    """Write ``chunks`` to the new file ``fd`` past the page cache (:class:`_DirectWriter`)."""
    _DirectWriter(fd, head).write_all(chunks)


@contextlib.contextmanager
def atomic_open(path: StrPath, durable: bool = True) -> Iterator[BinaryIO]:
    """``with atomic_open(path) as f:`` a binary file that appears under ``path``
    only when the block completes (temp file in the same folder, fsync, rename);
    on an exception the temp file is removed and ``path`` is untouched. Writers
    racing on one path each write their own temp file; the last rename wins.
    ``durable=False`` skips the two fsyncs: for files inside a temporary folder whose
    writer syncs them all before the folder is renamed into place (:func:`fsync_files`)."""
    path = os.path.abspath(os.fsdecode(path))
    while True:
        tmp = temp_sibling(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            break
        except FileExistsError:
            continue
    try:
        with open(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(os.path.dirname(path))
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write(path: StrPath, chunks: Iterable[Union[bytes, bytearray, memoryview]], durable: bool = True,
                 direct: bool = False, head: int = 0, hasher: Any = None) -> None:
    """Write an iterable of bytes-like chunks to path atomically (``durable``: :func:`atomic_open`).
    ``direct``: the data bypass the page cache where the OS and file system allow (O_DIRECT, see
    :class:`_DirectWriter`): for large outputs nothing reads back soon (a model directory's weights),
    whose copy into the page cache costs more CPU than computing them on some hosts (measured on
    this project's 2-core VM: 2.1 s of kernel time to write 0.8 GB, against 0.06 s direct); the first
    ``head`` bytes still go through it. ``hasher`` (e.g. ``hashlib.sha256()``): its ``update`` sees
    each chunk, in order, as it is written, so the file's digest needs no read-back."""
    if hasher is not None:
        chunks = _hashed(chunks, hasher)
    if not (direct and hasattr(os, "O_DIRECT")):
        with atomic_open(path, durable) as f:
            for c in chunks:
                f.write(c)
        return
    with atomic_open(path, durable) as f:
        _write_direct(f.fileno(), chunks, head)


def _hashed(chunks: Iterable[Union[bytes, bytearray, memoryview]], hasher: Any
            ) -> Iterator[Union[bytes, bytearray, memoryview]]:
    for c in chunks:
        hasher.update(c)
        yield c


def in_background(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``fn()`` in a daemon thread (one that never holds up the interpreter's exit, e.g. after
    an error elsewhere); returns a function that waits for it and returns its result or raises its
    exception."""
    box: Dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller of the result function
            box["error"] = e

    t = threading.Thread(target=run, name="orkpy-background", daemon=True)
    t.start()

    def result() -> Any:
        t.join()
        if "error" in box:
            raise box["error"]
        return box["value"]
    return result


def fsync_file(path: str) -> None:
    """fsync the file at ``path`` (its data, not its folder entry)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_files(folder: str) -> None:
    """fsync every regular file directly in ``folder``, then the folder: what files written with
    ``durable=False`` need before the folder is renamed into place."""
    for fn in sorted(os.listdir(folder)):
        fp = os.path.join(folder, fn)
        if os.path.isfile(fp):
            fsync_file(fp)
    fsync_dir(folder)


def read_text_like_llama_cpp(path: StrPath) -> str:
    """A text file as llama-perplexity -f reads it: UTF-8, one trailing newline dropped.
    A file that is not UTF-8 raises ValueError naming it and the first bad byte's offset."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{os.fspath(path)}: not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} "
                         f"({e.reason})") from None
    return text[:-1] if text.endswith("\n") else text


def sha256_file(path: StrPath, bufsize: int = 1 << 22) -> str:
    """Hex SHA-256 of a file's bytes. A non-empty regular file is hashed from a guarded mapping
    (:class:`orkpy._core.MappedFile`: no copy through ``read()``, each hashed stretch's pages released
    after it, FormatError naming the file if it changes meanwhile); anything else is read."""
    h = hashlib.sha256()
    st = os.stat(path)
    if stat.S_ISREG(st.st_mode) and st.st_size > 0:
        from ._mapped import MappedFile
        try:
            m = MappedFile(path)
        except OSError:  # a file system that cannot map it: read it below
            pass
        else:
            with m:
                return sha256_mapped(m, bufsize)
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def sha256_mapped(m: Any, bufsize: int = 1 << 22) -> str:
    """Hex SHA-256 of the bytes of an open :class:`orkpy._core.MappedFile` (each hashed stretch's
    pages released after it; FormatError naming the file if it changes meanwhile). The mapping stays
    open: a loader hashes the very mapping it then reads."""
    from ._mapped import guarded
    h = hashlib.sha256()
    with guarded((m,)):
        mv = memoryview(m)
        try:
            for off in range(0, len(m), bufsize):
                h.update(mv[off:off + bufsize])
                m.release(off, min(bufsize, len(m) - off))
        finally:
            mv.release()
    return h.hexdigest()


def sha256_dir(path: StrPath) -> str:
    """Hex SHA-256 over the sorted (name, SHA-256) of the regular files directly in a folder."""
    h = hashlib.sha256()
    for fn in sorted(os.listdir(path)):
        fp = os.path.join(path, fn)
        if os.path.isfile(fp):
            h.update(fn.encode() + b"\0" + sha256_file(fp).encode())
    return h.hexdigest()


PLAIN_EVERY = 0.10      # plain progress lines: one per 10 % of the total (if PLAIN_GAP s have passed) ...
PLAIN_GAP = 2.0
PLAIN_SECONDS = 30.0    # ... and at least one per 30 s


class PlainProgress:
    """Sparse one-line progress reports for a stream that is not a terminal (a
    log file, CI): a line on the first update, then whenever another 10 % of the
    total is done (at most one per 2 s) or 30 s have passed, and a last line on
    ``close``; never a redraw. The same calls as a tqdm bar (``update``, ``set_postfix``, ``close``)."""

    def __init__(self, total, desc, unit="it", file=None):
        self.total, self.desc, self.unit = total, desc, unit
        self.file = file
        self.n = 0
        self.postfix = {}
        self._t0 = self._last_t = time.monotonic()
        self._last_n = None
        self._next_n = 0

    def set_postfix(self, ordered_dict=None, refresh=True, **kw):
        self.postfix = dict(ordered_dict or {}, **kw)

    def update(self, n=1):
        self.n += n
        now = time.monotonic()
        since = now - self._last_t
        if (self._last_n is None or (self.n >= self._next_n and since >= PLAIN_GAP)
                or since >= PLAIN_SECONDS):
            self._emit(now)

    def close(self):
        if self._last_n != self.n:
            self._emit(time.monotonic())

    def _emit(self, now):
        el = now - self._t0
        units = self.unit if self.unit == "it" else self.unit + "s"
        if self.total:
            s = f"{self.desc}: {self.n}/{self.total} {units} ({100 * self.n / self.total:.0f}%), {el:.1f} s"
            left = el * (self.total - self.n) / self.n if self.n else 0.0
            if 0 < self.n < self.total and left >= 1:
                s += f", ~{left:.0f} s left"
            step = max(1, math.ceil(PLAIN_EVERY * self.total))
            self._next_n = (self.n // step + 1) * step
        else:
            s = f"{self.desc}: {self.n} {units}, {el:.1f} s"
        if self.postfix:
            s += ", " + ", ".join(f"{k}={v}" for k, v in self.postfix.items())
        print(s, file=self.file or sys.stderr, flush=True)
        self._last_t, self._last_n = now, self.n


def _in_notebook():
    ip = sys.modules.get("IPython")
    try:
        shell = ip.get_ipython() if ip is not None else None
    except Exception:  # pragma: no cover - a broken IPython is not ours to report
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


@contextlib.contextmanager
def counted(items: Iterable[Any], total: int, desc: str, enabled: bool = True,
            unit: str = "it") -> Iterator[Iterator[Any]]:
    """``items`` as an iterator that moves a :func:`progress_bar` of ``total`` steps by one per
    item taken; the bar is closed when the block ends, however it ends."""
    bar = progress_bar(total, desc, enabled, unit)

    def each() -> Iterator[Any]:
        for item in items:
            yield item
            if bar is not None:
                bar.update(1)
    try:
        yield each()
    finally:
        if bar is not None:
            bar.close()


def progress_bar(total, desc, enabled=True, unit="it", file=None):
    """Progress on stderr (or ``file``), or None when not ``enabled``: a live tqdm
    bar on a terminal, ``tqdm.auto`` (a widget where available) in a Jupyter
    kernel, and sparse plain lines (:class:`PlainProgress`) when the stream is
    not a terminal or tqdm is not installed."""
    if not enabled:
        return None
    stream = file or sys.stderr
    notebook = _in_notebook()
    isatty = getattr(stream, "isatty", None)
    if notebook or (isatty is not None and isatty()):
        try:
            if notebook:
                from tqdm.auto import tqdm
            else:
                from tqdm import tqdm
        except ImportError:
            pass
        else:
            return tqdm(total=total, desc=desc, unit=unit, file=stream)
    return PlainProgress(total, desc, unit, stream)
