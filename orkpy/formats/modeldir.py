"""The quantized model directory on disk (docs/formats.md): writing it
atomically and reading it back with every checksum verified.

- :func:`write_model_dir`: ``manifest.json`` (tensor -> tier, kind, file,
  sha256; source / allocation / imatrix records; settings; the recipe), one O4N1/O8N1 blob
  per packed linear, and ``float.gguf`` (the source's metadata, embeddings,
  norms and float-tier linears in their source precision), written to a
  temporary folder of the writer's own and renamed into place.
- :func:`read_model_dir`: the checked manifest and the files it lists
  (:class:`ModelDir`); ``orkpy.load_model(dir)`` builds the model from it.

This module knows files, not models: it imports nothing that runs a forward pass.
"""
from __future__ import annotations

import collections
import errno
import functools
import json
import os
import re
import shutil
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Set, Tuple

import numpy as np

from .._core import FormatError
from .._io import (atomic_write, fsync_dir, fsync_file, fsync_files, json_finite_float, sha256_file, sha256_mapped,
                   temp_sibling)
from .._mapped import check as check_maps
from .._mapped import MappedFile, maps_of
from .._typing import StrPath
from ..kernels.packed import PackedWeight, _map_saved, _release_pages, load_packed, save_packed_sha256
from .arch import PACKED_LOOKUP_KEY
from .gguf import GGUFFile
from .source import Source
from ..kernels.quant import KIND_INFO
from .tiermap import EMBEDDING
from .manifest import FORMAT, MANIFEST, MANIFEST_MAX, VERSION
from .manifest import Vanished as _Vanished
from .manifest import listed_files as _listed_files
from .manifest import no_constant as _no_constant
from .manifest import open_in as _open_in
from .manifest import plain_name as _plain
from .manifest import read_manifest as _read_manifest
from .manifest import tier_ok as _tier_ok

FLOAT_FILE = "float.gguf"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
ACT_FILE = "act_scales.json"  # calibrated activation ranges and outlier channels (orkpy.runtime.actcal)


# ------------------------------------------------------------------- write --

ROWS_BYTES = 64 << 20  #: float32 bytes of a float.gguf tensor read at once (a larger table: in blocks of rows)


class ModelDirWriter:
    """A model directory written as it goes (what :func:`write_model_dir` and the streaming
    ``quantize_model(..., output=)`` use): :meth:`add` saves one packed linear into the
    writer's own temporary folder next to ``path`` and returns it mapped from there (so the
    caller holds no copy; :meth:`add_later` does it on a thread of the writer's while the caller
    goes on), :meth:`finish` writes ``float.gguf`` (one tensor at a time) and the manifest and
    renames the folder into place; :meth:`abort`, or leaving a ``with`` block by an error,
    removes the folder. Nothing appears at ``path`` before :meth:`finish`."""

    def __init__(self, path: StrPath, overwrite: bool = False) -> None:
        path = os.path.abspath(os.fspath(path))
        if os.path.lexists(path):
            if not overwrite:
                raise FileExistsError(f"{path} exists (pass overwrite=True to replace it)")
            check_replaceable(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        while True:  # a temp folder of our own: concurrent saves to one path never share one
            tmp = temp_sibling(path)
            try:
                os.mkdir(tmp)
                break
            except FileExistsError:
                continue
        self.path, self.overwrite = path, bool(overwrite)
        self.tmp: Optional[str] = tmp
        self.entries: Dict[str, Dict[str, Any]] = {}
        # add_later's queue: jobs written in order by one thread of the writer's, at most
        # IN_FLIGHT bytes of packed weights held (or a single job of any size)
        self._cv = threading.Condition()
        self._queue: Deque[Tuple[str, PackedWeight, str, Callable[[PackedWeight], None], int]] = collections.deque()
        self._writing = 0         # bytes of the job being written (0: none)
        self._running = False     # the writer's thread is alive
        self._cancel = False      # abort: queued jobs are dropped
        self._failed = False      # a job failed: later jobs are dropped, nothing more is written
        self._err: Optional[BaseException] = None  # that failure, until raised in the caller

    def __enter__(self) -> "ModelDirWriter":
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if kind is not None:
            self.abort()

    IN_FLIGHT = 32 << 20  #: bytes of packed weights add_later may hold waiting for the disk

    def add_later(self, name: str, pw: PackedWeight, tier: str, done: Callable[[PackedWeight], None]) -> None:
        """:meth:`add` on a thread of the writer's, so the caller quantizes the next linears while
        this one is written and hashed. Jobs are written one at a time, in order; this returns at
        once unless the jobs waiting hold more than IN_FLIGHT bytes (then it waits until the new
        one fits, or until nothing waits), so memory holds a bounded number of packed linears.
        ``done(mapped)`` runs on that thread when the file is written. The first error of a job is
        raised by the next :meth:`add_later`, :meth:`wait` or :meth:`finish`; the jobs after it are
        dropped and every later call refuses (the directory can only be aborted)."""
        nbytes = max(1, int(pw.store.nbytes) + int(np.asarray(pw.bscale).nbytes))
        with self._cv:
            while not self._failed and self._busy() and self._held() + nbytes > self.IN_FLIGHT:
                self._cv.wait()
            self._raise_failure()
            if self.tmp is None:
                raise ValueError(f"{self.path}: the model directory is already finished or aborted")
            self._queue.append((name, pw, tier, done, nbytes))
            try:
                self._kick()
            except BaseException:  # no thread to write it: the job was not taken
                self._queue.pop()
                raise

    def _busy(self) -> bool:
        return bool(self._queue) or self._writing > 0 or self._running

    def _held(self) -> int:
        return sum(j[4] for j in self._queue) + self._writing

    def _kick(self) -> None:
        """Start the writer's thread if jobs wait and none runs (under ``_cv``)."""
        if self._queue and not self._running:
            threading.Thread(target=self._drain, name="orkpy-model-dir-writer", daemon=True).start()
            self._running = True

    def _drain(self) -> None:
        """The writer's thread: writes the queued jobs in order, then ends."""
        while True:
            with self._cv:
                if not self._queue:
                    self._running = False
                    self._cv.notify_all()
                    return
                name, pw, tier, done, nbytes = self._queue.popleft()
                self._writing = nbytes
                skip = self._cancel or self._failed
                tmp = self.tmp
            try:
                if not skip and tmp is not None:
                    mapped = self._add(name, pw, tier)
                    # on this thread, the data reach the disk while the caller computes (finish's sync is then cheap)
                    fsync_file(os.path.join(tmp, self.entries[name]["file"]))
                    done(mapped)
            except BaseException as e:  # handed to the caller's thread by wait()
                with self._cv:
                    if not self._failed:
                        self._failed, self._err = True, e
            finally:
                del pw
                with self._cv:
                    self._writing = 0
                    self._cv.notify_all()

    def _raise_failure(self) -> None:
        """Raise a job's error (once), then a ValueError on every later call."""
        if self._err is not None:
            e, self._err = self._err, None
            raise e
        if self._failed:
            raise ValueError(f"{self.path}: an earlier write of this model directory failed (raised then); "
                             "it can only be aborted")

    def wait(self) -> None:
        """Wait for every :meth:`add_later` job; raise the first error of one, if any."""
        with self._cv:
            while self._busy():
                self._kick()  # jobs queued with no thread (one could not start): start it again
                self._cv.wait()
            self._raise_failure()

    def add(self, name: str, pw: PackedWeight, tier: str) -> PackedWeight:
        """Save the packed linear ``name`` (tier ``tier``); returns it mapped from the saved file
        (after any :meth:`add_later` in flight)."""
        self.wait()
        return self._add(name, pw, tier)

    def _add(self, name: str, pw: PackedWeight, tier: str) -> PackedWeight:
        if self.tmp is None:
            raise ValueError(f"{self.path}: the model directory is already finished or aborted")
        fn = name + (".o8n1" if KIND_INFO[pw.kind].bits == 8 else ".o4n1")
        fp = os.path.join(self.tmp, fn)
        # finish syncs the folder's files at once; the weights bypass the page cache (nothing reads them back now)
        digest = save_packed_sha256(pw, fp, durable=False, direct=True)
        self.entries[name] = {"tier": tier, "kind": pw.kind, "file": fn, "shape": list(pw.shape),
                              "sha256": digest}
        pw = _map_saved(pw, fp)  # (int6 / int5: unpacked when first used)
        _release_pages(pw)  # pages a load's checks read go back to the file
        return pw

    def finish(self, tiers: Mapping[str, str], float_linears: Mapping[str, str], src: Source,
               record: Mapping[str, Any], act_scales: Optional[bytes] = None) -> str:
        """Write ``float.gguf`` and the manifest (see :func:`write_model_dir` for the arguments)
        and rename the folder into place; returns its absolute path."""
        from .gguf_write import LazyTensor, metadata_triples, write_gguf

        self.wait()
        tmp = self.tmp
        if tmp is None:
            raise ValueError(f"{self.path}: the model directory is already finished or aborted")
        try:
            entries = dict(self.entries)
            for name, e in entries.items():
                e["tier"] = tiers.get(name, e["tier"])
            names = src.float_names()
            names += [t for t in dict.fromkeys(float_linears.values()) if t not in names]
            meta = metadata_triples(src.meta)
            if record.get("settings", {}).get("tied_lookup") == "packed":  # the table is the packed head's rows
                names = [t for t in names if t != EMBEDDING]
                meta = [m for m in meta if m[0] != PACKED_LOOKUP_KEY] + [
                    (PACKED_LOOKUP_KEY, "UINT32", int(src.shapes()[EMBEDDING][0]))]
            maps: List[Any] = []
            shapes = src.shapes()

            def make(name: str, f16: bool) -> Any:
                src.release()  # the tensor before is written: its pages and cached copies go
                a = src.tensor(name)
                maps.extend(m for m in maps_of(a) if not any(m is x for x in maps))
                return a.astype(np.float16) if f16 else np.ascontiguousarray(a, dtype=np.float32)

            def make_rows(name: str, f16: bool) -> Any:  # a large table in blocks of rows (Source.rows)
                src.release()
                N, K = shapes[name]
                step = max(1, ROWS_BYTES // (4 * K))
                for r in range(0, N, step):
                    a = src.rows(name, slice(r, min(N, r + step)))
                    yield a.astype(np.float16) if f16 else a
                    src.release(caches=False)

            floats: List[Tuple[str, LazyTensor]] = []
            for name in names:
                f16 = src.type_of(name) == "F16" or (name == EMBEDDING and src.tied and src.type_of(name) not in ("F32", "BF16"))  # a quantized tied table: F16
                big = len(shapes[name]) == 2 and 4 * int(np.prod(shapes[name])) > ROWS_BYTES
                floats.append((name, LazyTensor(shapes[name], np.float16 if f16 else np.float32,
                                                functools.partial(make_rows if big else make, name, f16), blocks=big)))
            for name, tensor in float_linears.items():
                entries[name] = {"tier": "float", "kind": "float", "tensor": tensor, "shape": list(shapes[tensor])}
            float_sha = write_gguf(os.path.join(tmp, FLOAT_FILE), meta, floats, direct=True, digest=True)
            src.release()
            check_maps(maps)  # no float.gguf from a source that changed while it was read
            manifest = {"format": FORMAT, "version": VERSION, **record,
                        "float_file": {"file": FLOAT_FILE, "sha256": float_sha},
                        "tensors": entries}
            if act_scales is not None:
                atomic_write(os.path.join(tmp, ACT_FILE), [act_scales], durable=False)
                manifest["act_scales"] = {"file": ACT_FILE, "sha256": sha256_file(os.path.join(tmp, ACT_FILE))}
            atomic_write(os.path.join(tmp, MANIFEST), [json.dumps(manifest, indent=1, sort_keys=True).encode()],
                         durable=False)
            fsync_files(tmp)  # every file of the folder, synced once before the rename
            _install_dir(tmp, self.path, self.overwrite)
        except _ForeignKept:
            self.tmp = None  # the folder at tmp is no longer ours: never deleted
            raise
        except BaseException:
            self.abort()
            raise
        self.tmp = None
        return self.path

    def abort(self) -> None:
        """Remove the temporary folder (and what was saved in it) once no write is in flight; safe
        to call twice."""
        with self._cv:
            self._cancel = True  # jobs not begun are dropped
            self._queue.clear()
        while True:  # a second Ctrl-C during the wait still waits for the write in flight
            try:
                with self._cv:
                    while self._writing or self._running:
                        self._cv.wait()
                break
            except KeyboardInterrupt:
                continue
        self._err = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def write_model_dir(path: StrPath, packed: Mapping[str, PackedWeight], tiers: Mapping[str, str],
                    float_linears: Mapping[str, str], src: Source, record: Mapping[str, Any],
                    overwrite: bool = False, act_scales: Optional[bytes] = None) -> str:
    """Write a model directory atomically (temp folder + rename); returns its absolute path.

    ``packed``: linear name -> PackedWeight (one blob each); ``tiers``: linear name -> tier;
    ``float_linears``: float-tier linear name -> the source tensor holding its weight (stored in
    ``float.gguf``); ``src``: the source of the metadata and the float tensors; ``record``: the
    manifest's descriptive fields (source, alloc, imatrix, double_quant, settings, int8_share);
    ``act_scales``: the bytes of ``act_scales.json`` (:class:`orkpy.runtime.actcal.ActCalibration`), if any."""
    with ModelDirWriter(path, overwrite) as w:
        for name, pw in packed.items():
            w.add(name, pw, tiers[name])
        return w.finish(tiers, float_linears, src, record, act_scales)


def check_replaceable(path: StrPath) -> None:
    """Refuse, before any work, to replace what orkpy did not write (``overwrite=True``): a file, a
    symbolic link, or a folder that is neither empty nor an orkpy model directory, one whose
    ``manifest.json`` is orkpy's (its format, version and file list, as :func:`read_model_dir`
    checks them) and which holds nothing but that manifest, the files it lists and orkpy's own
    temporary files of those names (``.<name>.tmp-*``). FileExistsError / NotADirectoryError naming
    the path and what was found; a missing path is fine. (One open folder is inspected, so a
    concurrent saver swapping ``path`` cannot confuse the check.)"""
    path = os.path.abspath(os.fspath(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC)
    except FileNotFoundError:
        return  # moved away meanwhile: nothing to replace
    except OSError as e:
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        kind = "a symbolic link" if os.path.islink(path) else "not a directory"
        raise NotADirectoryError(f"{path}: exists and is {kind}; a model is saved as a directory of its own, "
                                 "remove it or choose another path") from None
    try:
        problem, _ = _inspect(fd, path)
    finally:
        os.close(fd)
    if problem is not None:
        raise _refusal(path, problem)


_check_replaceable = check_replaceable


def _refusal(path: str, problem: str) -> FileExistsError:
    return FileExistsError(f"{path}: {problem}; refusing to replace it (overwrite replaces only an orkpy model "
                           "directory or an empty folder)")


def _orkpy_temp(name: str, ours: Set[str]) -> bool:
    """Whether ``name`` is a temp file orkpy's atomic writer (orkpy._io.temp_sibling) makes for one of ``ours``."""
    m = _TEMP_NAME.match(name)
    return m is not None and m.group(1) in {os.fsdecode(os.fsencode(n)[:100]) for n in ours}


_TEMP_NAME = re.compile(r"\.(.+)\.tmp-[0-9]+-[0-9]+-[0-9a-f]{8}\Z", re.S)


def _inspect(dfd: int, path: str) -> Tuple[Optional[str], List[str]]:
    """(what makes the folder open as ``dfd`` not replaceable, or None; its entries orkpy wrote):
    see :func:`check_replaceable`."""
    names = sorted(os.listdir(dfd))
    if not names:
        return None, []
    if MANIFEST not in names:
        return (f"not an orkpy model directory: a non-empty folder without {MANIFEST} "
                f"(holds {_some(names, dfd)})"), []
    mpath = os.path.join(path, MANIFEST)
    try:
        files = _listed_files(_read_manifest(dfd, path), mpath)[0]
    except FormatError as e:
        why = str(e)
        for prefix in (mpath + ": ", path + ": "):
            why = why[len(prefix):] if why.startswith(prefix) else why
        return f"not an orkpy model directory: {MANIFEST} is not orkpy's ({why})", []
    listed = {MANIFEST} | {fn for fn, _ in files}
    ours: List[str] = []
    foreign: List[str] = []
    for n in names:
        if n in listed or _orkpy_temp(n, listed):
            try:
                is_dir = stat.S_ISDIR(os.stat(n, dir_fd=dfd, follow_symlinks=False).st_mode)
            except FileNotFoundError:
                continue
            (foreign if is_dir else ours).append(n)   # a folder: orkpy writes none (its contents would go too)
        else:
            foreign.append(n)
    if foreign:
        return f"holds files orkpy did not write: {_some(foreign, dfd)}", ours
    return None, ours


def _some(names: List[str], dfd: int, n: int = 5) -> str:
    """The first ``n`` names, folders marked with a trailing slash."""
    def show(name: str) -> str:
        try:
            return name + "/" if stat.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode) else name
        except OSError:
            return name
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(show(x) for x in names[:n]) + more


def _problem_at(folder: str) -> Optional[str]:
    """:func:`_inspect` of a folder this save just moved out of the way (None: ours to delete)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC)
    except OSError as e:
        return f"cannot be inspected ({e.strerror or e})"
    try:
        return _inspect(fd, folder)[0]
    except OSError as e:
        return f"cannot be inspected ({e.strerror or e})"
    finally:
        os.close(fd)


def _remove_replaced(folder: str) -> None:
    """Delete a model directory (or empty folder) a save moved out of the way: exactly the entries
    orkpy wrote (:func:`_inspect`), then the folder. A folder holding anything else -- put there
    since it was checked -- is left as it is (under its hidden temp name)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC)
    except OSError:
        return
    try:
        problem, ours = _inspect(fd, folder)
        if problem is not None:
            return
        for n in ours:
            try:
                os.unlink(n, dir_fd=fd)
            except FileNotFoundError:
                pass
    except OSError:
        return
    finally:
        os.close(fd)
    try:
        os.rmdir(folder)
    except OSError:  # something was added meanwhile: it stays
        pass


class _ForeignKept(FileExistsError):
    """A foreign folder was swapped out of ``path`` and could not be swapped back: it is under the
    writer's temp name, which must then not be deleted."""


def _exchange_dirs(a: str, b: str) -> bool:
    """Swap two existing paths in one atomic step (Linux renameat2 RENAME_EXCHANGE);
    False where the C library, kernel or file system cannot (the caller then moves
    ``b`` aside and renames, leaving a moment in which ``b`` is missing)."""
    global _renameat2
    if _renameat2 is None:
        try:
            import ctypes
            f = ctypes.CDLL(None, use_errno=True).renameat2
            f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            _renameat2 = f
        except (OSError, AttributeError):
            _renameat2 = False
    if _renameat2 is False:
        return False
    import ctypes
    if _renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return True
    e = ctypes.get_errno()
    if e in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOENT):  # ENOENT: b moved away
        return False
    raise OSError(e, os.strerror(e), a, None, b)


_renameat2: Any = None


def _install_dir(tmp: str, path: str, overwrite: bool) -> None:
    """Rename the complete folder ``tmp`` to ``path``, moving an existing ``path``
    aside first (overwrite) and deleting it after; the last of concurrent savers
    wins. Only what :func:`check_replaceable` accepts is replaced, and what is moved out of the
    way is checked again before it is deleted: something else is put back (or left, never deleted).
    On an error the moved-aside original goes back when ``path`` is free,
    and nothing moved aside is left behind."""
    aside: List[str] = []
    try:
        while True:
            try:
                os.rename(tmp, path)
                break
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                if not overwrite:
                    raise FileExistsError(f"{path} exists (pass overwrite=True to replace it)") from None
            check_replaceable(path)  # another writer may have put something else there
            if _exchange_dirs(tmp, path):  # atomic: path is never missing, even after a kill -9
                problem = _problem_at(tmp)  # what came out of path: changed since the check?
                if problem is not None:
                    try:
                        back = _exchange_dirs(tmp, path)
                    except OSError:
                        back = False
                    if not back:
                        raise _ForeignKept(f"{path}: {problem}, put there while this save replaced it; the new "
                                           f"model is at {path}, what was there is at {tmp} (nothing deleted)")
                    raise _refusal(path, problem)
                aside.append(tmp)
                break
            old = temp_sibling(path)
            try:
                os.rename(path, old)
            except FileNotFoundError:  # another saver moved it first
                continue
            aside.append(old)
            problem = _problem_at(old)
            if problem is not None:
                raise _refusal(path, problem)  # (moved back below, or left where it is: never deleted)
        fsync_dir(os.path.dirname(path))
    except BaseException:
        if aside and not os.path.lexists(path):
            try:
                os.rename(aside.pop(0), path)
            except OSError:
                pass
        raise
    finally:
        for old in aside:
            _remove_replaced(old)


# -------------------------------------------------------------------- read --

def _check_informational(manifest: Dict[str, Any], mpath: str) -> None:
    """Type-check the fields the loader does not use but reports (``Model.manifest``)."""
    def bad(key: str, want: str) -> FormatError:
        return FormatError(f"{mpath}: {key!r} must be {want}, got {manifest.get(key)!r:.80}")
    for key in ("source", "alloc", "settings"):
        if not isinstance(manifest.get(key), dict):
            raise bad(key, "a JSON object")
    src = manifest["source"]
    if not (isinstance(src.get("file"), str) and isinstance(src.get("sha256"), str)):
        raise bad("source", "{file: string, sha256: string}")
    im = manifest.get("imatrix")
    if im is not None and not (isinstance(im, dict) and isinstance(im.get("sha256"), str)
                               and type(im.get("chunks")) is int):
        raise bad("imatrix", "null or {sha256: string, chunks: int}")
    if not isinstance(manifest.get("double_quant"), bool):
        raise bad("double_quant", "true or false")
    if "recipe" in manifest and not isinstance(manifest["recipe"], dict):  # orkpy.quantization.recipe; checked by Recipe.load
        raise bad("recipe", "a JSON object (the recipe the model was made with)")
    share = manifest.get("int8_share")
    if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 <= share <= 1:
        raise bad("int8_share", "a number in [0, 1]")


@dataclass(frozen=True)
class ModelDir:
    """A model directory whose manifest and listed files have been checked (:func:`read_model_dir`):
    ``manifest`` (the parsed JSON), ``float_file`` (path of ``float.gguf``), ``entries`` (linear
    name -> manifest entry), ``act_scales_file`` (path of ``act_scales.json``, or None), ``files``
    (file name -> the :class:`orkpy._core.MappedFile` whose bytes were verified). Everything is
    read from ``files``, never opened again by path: a directory replaced meanwhile (a concurrent
    save) changes nothing."""

    path: str
    manifest: Dict[str, Any]
    float_file: str
    entries: Dict[str, Dict[str, Any]]
    act_scales_file: Optional[str] = None
    files: Mapping[str, MappedFile] = field(default_factory=dict, repr=False, compare=False)

    def tier(self, name: str) -> str:
        """The tier of linear ``name`` (FormatError naming the manifest if it has no entry)."""
        if name not in self.entries:
            raise FormatError(f"{os.path.join(self.path, MANIFEST)}: no entry for {name!r}")
        return str(self.entries[name]["tier"])

    def _mapping(self, fn: str) -> Optional[MappedFile]:
        return self.files.get(fn)

    def packed(self, name: str) -> PackedWeight:
        """The packed weight of an int8/int4 linear, checked against its manifest entry."""
        e = self.entries[name]
        pw = load_packed(os.path.join(self.path, e["file"]), mapping=self._mapping(e["file"]))
        if list(pw.shape) != list(e["shape"]) or pw.kind != e["kind"]:
            raise FormatError(f"{self.path}: {e['file']} does not match its manifest entry")
        return pw

    def float_gguf(self) -> GGUFFile:
        """``float.gguf``, parsed from the verified mapping."""
        return GGUFFile(self.float_file, mapping=self._mapping(os.path.basename(self.float_file)))

    def act_scales_bytes(self) -> Optional[bytes]:
        """The verified bytes of ``act_scales.json`` (None: the model has none)."""
        if self.act_scales_file is None:
            return None
        m = self._mapping(os.path.basename(self.act_scales_file))
        if m is None:
            with open(self.act_scales_file, "rb") as f:
                return f.read()
        return bytes(memoryview(m)) if len(m) else b""

    def float_tensor(self, name: str) -> Tuple[str, Tuple[int, int]]:
        """(tensor name in float.gguf, shape) of a float-tier linear."""
        e = self.entries[name]
        return e["tensor"], (e["shape"][0], e["shape"][1])


READ_ATTEMPTS = 4  #: a directory replaced while it is read (a concurrent save) is read again, at most this often
_RETRY_SLEEP = (0.0, 0.005, 0.02, 0.05)


class _Replaced(FormatError):
    """The directory was replaced or removed while it was read."""


def _replaced(dfd: int, path: str) -> bool:
    """Whether the directory open as ``dfd`` is no longer the one at ``path`` (or was removed)."""
    try:
        st = os.fstat(dfd)
        now = os.stat(path)
    except OSError:
        return True
    return st.st_nlink == 0 or (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino)


def _read_pinned(path: str) -> ModelDir:
    """One attempt of :func:`read_model_dir`: the directory is opened once and every file relative
    to that descriptor; each listed file is mapped, and hashed from that mapping, which is what the
    model is then loaded from. _Replaced when the directory was replaced or removed meanwhile."""
    try:
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    except FileNotFoundError:
        raise _Replaced(f"{path}: no such directory") from None
    except OSError as e:  # not a directory, no permission ...
        raise FormatError(f"{path}: cannot open the model directory ({e.strerror or e})") from None
    maps: Dict[str, MappedFile] = {}
    try:
        try:
            manifest = _read_manifest(dfd, path)
            mpath = os.path.join(path, MANIFEST)
            files, entries, float_file, act = _listed_files(manifest, mpath)
            _check_informational(manifest, mpath)
            for fn, digest in files:
                if fn not in maps:
                    fd, _ = _open_in(dfd, fn, path)
                    try:
                        maps[fn] = MappedFile(os.path.join(path, fn), fd=fd)
                    except OSError as e:
                        raise FormatError(f"{path}: cannot map {fn} ({e.strerror or e})") from None
                    finally:
                        os.close(fd)
                if sha256_mapped(maps[fn]) != digest:
                    raise FormatError(f"{path}: checksum mismatch for {fn}: the file was changed or damaged")
        except _Vanished as e:
            if _replaced(dfd, path):
                raise _Replaced(str(e)) from None
            raise FormatError(str(e)) from None
    except BaseException:
        for m in maps.values():
            m.close()
        raise
    finally:
        os.close(dfd)
    return ModelDir(path, manifest, os.path.join(path, float_file["file"]), entries,
                    None if act is None else os.path.join(path, act["file"]), maps)


def read_model_dir(path: StrPath) -> ModelDir:
    """Read and check a model directory's manifest, and verify every file it lists (checksums;
    plain names; links only to files of the folder). Any problem is an orkpy.FormatError naming it.

    The checked bytes are the bytes used: the directory is opened once, the manifest and every
    file are opened relative to that descriptor and the files are hashed from the mappings the
    returned :class:`ModelDir` holds (``files``), from which the model is loaded. A directory
    replaced by a concurrent save is thus read as the old model or the new one, complete; when
    the old one is deleted under the reader (a file vanishes), it is read again, up to
    :data:`READ_ATTEMPTS` times, then FormatError."""
    path = os.fspath(path)
    why = ""
    for attempt in range(READ_ATTEMPTS):
        if attempt:
            time.sleep(_RETRY_SLEEP[min(attempt, len(_RETRY_SLEEP) - 1)])
        try:
            return _read_pinned(path)
        except _Replaced as e:
            why = str(e)
    raise FormatError(f"{why} (read {READ_ATTEMPTS} times: the directory was replaced or removed while it was "
                      "read, by a concurrent save?)")


def save_in_progress(path: StrPath) -> bool:
    """Whether a folder an orkpy save of ``path`` works in (``.<name>.tmp-*``, orkpy._io.temp_sibling)
    exists next to it: a ``path`` missing meanwhile may be one being replaced."""
    d, base = os.path.split(os.path.abspath(os.fspath(path)))
    try:
        names = os.listdir(d or ".")
    except OSError:
        return False
    return any(_orkpy_temp(n, {base}) and os.path.isdir(os.path.join(d, n)) for n in names)


__all__ = ["ACT_FILE", "FORMAT", "MANIFEST", "MANIFEST_MAX", "ModelDir", "READ_ATTEMPTS", "VERSION", "check_replaceable",
           "read_model_dir", "save_in_progress", "write_model_dir"]
