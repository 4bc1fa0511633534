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
import shutil
import stat
import threading
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple

import numpy as np

from .._core import FormatError
from .._io import atomic_write, fsync_dir, fsync_file, fsync_files, json_finite_float, sha256_file, temp_sibling
from .._mapped import check as check_maps
from .._mapped import maps_of
from .._typing import StrPath
from ..kernels.packed import PackedWeight, _map_saved, load_packed, save_packed_sha256
from .arch import PACKED_LOOKUP_KEY
from .source import Source
from ..kernels.quant import KIND_INFO
from .tiermap import EMBEDDING, TIERS, split_tier

MANIFEST = "manifest.json"
FORMAT = "orkpy-quantized-model"
VERSION = 1
MANIFEST_MAX = 64 << 20
FLOAT_FILE = "float.gguf"
ACT_FILE = "act_scales.json"  # calibrated activation ranges and outlier channels (orkpy.runtime.actcal)


def _tier_ok(tier: object) -> bool:
    """A manifest tier: a base tier, or an integer tier with a group size (orkpy.formats.tiermap.split_tier)."""
    try:
        return isinstance(tier, str) and split_tier(tier)[0] in TIERS
    except ValueError:
        return False


# ------------------------------------------------------------------- write --

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
            _check_replaceable(path)
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
        pw = _map_saved(pw, fp)  # (int6 / int5: loaded, unpacked in memory)
        for m in maps_of(pw.store, pw.bscale):  # pages a load's checks read go back to the file
            m.release()
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

            floats: List[Tuple[str, LazyTensor]] = []
            for name in names:
                f16 = src.type_of(name) == "F16"
                floats.append((name, LazyTensor(shapes[name], np.float16 if f16 else np.float32,
                                                functools.partial(make, name, f16))))
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


def _check_replaceable(path: str) -> None:
    """Refuse, before any work, to replace what is not a model directory: a file, a
    symbolic link, or a non-empty folder without a manifest. (One open folder is
    inspected, so a concurrent saver swapping ``path`` cannot confuse the check.)"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return  # moved away meanwhile: nothing to replace
    except OSError as e:
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        kind = "a symbolic link" if os.path.islink(path) else "not a directory"
        raise NotADirectoryError(f"{path}: exists and is {kind}; a model is saved as a directory of its own, "
                                 "remove it or choose another path") from None
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    if names and MANIFEST not in names:
        raise FileExistsError(f"{path}: a non-empty directory without {MANIFEST} (not an orkpy model "
                              "directory): refusing to replace it")


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
    wins. On an error the moved-aside original goes back when ``path`` is free,
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
            _check_replaceable(path)  # another writer may have put something else there
            if _exchange_dirs(tmp, path):  # atomic: path is never missing, even after a kill -9
                aside.append(tmp)
                break
            old = temp_sibling(path)
            try:
                os.rename(path, old)
            except FileNotFoundError:  # another saver moved it first
                continue
            aside.append(old)
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
            shutil.rmtree(old, ignore_errors=True)


# -------------------------------------------------------------------- read --

def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


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
    name -> manifest entry), ``act_scales_file`` (path of ``act_scales.json``, or None)."""

    path: str
    manifest: Dict[str, Any]
    float_file: str
    entries: Dict[str, Dict[str, Any]]
    act_scales_file: Optional[str] = None

    def tier(self, name: str) -> str:
        """The tier of linear ``name`` (FormatError naming the manifest if it has no entry)."""
        if name not in self.entries:
            raise FormatError(f"{os.path.join(self.path, MANIFEST)}: no entry for {name!r}")
        return str(self.entries[name]["tier"])

    def packed(self, name: str) -> PackedWeight:
        """The packed weight of an int8/int4 linear, checked against its manifest entry."""
        e = self.entries[name]
        pw = load_packed(os.path.join(self.path, e["file"]))
        if list(pw.shape) != list(e["shape"]) or pw.kind != e["kind"]:
            raise FormatError(f"{self.path}: {e['file']} does not match its manifest entry")
        return pw

    def float_tensor(self, name: str) -> Tuple[str, Tuple[int, int]]:
        """(tensor name in float.gguf, shape) of a float-tier linear."""
        e = self.entries[name]
        return e["tensor"], (e["shape"][0], e["shape"][1])


def read_model_dir(path: StrPath) -> ModelDir:
    """Read and check a model directory's manifest, and verify every file it lists (checksums;
    plain names; links only within the folder). Any problem is an orkpy.FormatError naming it."""
    path = os.fspath(path)
    mpath = os.path.join(path, MANIFEST)
    try:
        st = os.stat(mpath)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MANIFEST_MAX:  # a FIFO would block open()
            raise FormatError(f"{mpath}: not a regular file of at most {MANIFEST_MAX >> 20} MiB")
        with open(mpath, "rb") as f:
            raw = f.read(MANIFEST_MAX + 1)
    except FileNotFoundError:
        raise FormatError(f"{path}: no {MANIFEST}: not an orkpy quantized model directory") from None
    except OSError as e:  # a directory named manifest.json, no permission, path not a directory ...
        raise FormatError(f"{mpath}: cannot read the manifest ({e.strerror or e})") from None
    try:
        manifest = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_float=json_finite_float)
    except (ValueError, RecursionError) as e:  # bad UTF-8 / JSON, an integer too long, nesting too deep
        raise FormatError(f"{mpath}: not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FormatError(f"{mpath}: not an orkpy quantized model manifest")
    version = manifest.get("version")
    if type(version) is not int or version != VERSION:  # not true, not 1.0
        raise FormatError(f"{mpath}: unsupported manifest version {version!r}")

    def field(obj: Any, key: str, typ: type, where: str) -> Any:
        v = obj.get(key)
        if not isinstance(v, typ) or isinstance(v, bool):
            raise FormatError(f"{mpath}: {where}{key!r} is missing or not a JSON {typ.__name__}")
        return v
    entries = field(manifest, "tensors", dict, "")
    float_file = field(manifest, "float_file", dict, "")
    files = [(field(float_file, "file", str, "float_file "), field(float_file, "sha256", str, "float_file "))]
    act = manifest.get("act_scales")
    if act is not None:
        if not isinstance(act, dict):
            raise FormatError(f"{mpath}: 'act_scales' must be null or {{file: string, sha256: string}}")
        files.append((field(act, "file", str, "act_scales "), field(act, "sha256", str, "act_scales ")))
    for name, ent in entries.items():
        where = f"tensor {name!r} "
        if not isinstance(ent, dict):
            raise FormatError(f"{mpath}: {where}entry is not a JSON object")
        shape = field(ent, "shape", list, where)
        if len(shape) != 2 or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise FormatError(f"{mpath}: {where}shape {shape!r} is not two integers")
        field(ent, "kind", str, where)
        if not _tier_ok(ent.get("tier")):
            raise FormatError(f"{mpath}: tensor {name!r} tier {ent.get('tier')!r} is not one of "
                              f"{', '.join(TIERS)} (the integer tiers optionally with a group size, 'int4-g32')")
        if ent["tier"] == "float":  # its weight is a tensor of float.gguf, covered by that file's checksum
            field(ent, "tensor", str, where)
            if ent["kind"] != "float":
                raise FormatError(f"{mpath}: {where}of tier 'float' has kind {ent['kind']!r}, not 'float'")
            continue
        files.append((field(ent, "file", str, where), field(ent, "sha256", str, where)))
    _check_informational(manifest, mpath)
    root = os.path.realpath(path)
    for fn, digest in files:
        if not isinstance(fn, str) or os.path.basename(fn) != fn or fn in ("", ".", ".."):
            raise FormatError(f"{mpath}: bad file name {fn!r}")
        fp = os.path.join(path, fn)
        if not os.path.isfile(fp):
            raise FormatError(f"{path}: {fn} is missing or not a regular file")
        if os.path.commonpath([root, os.path.realpath(fp)]) != root:  # links may point only within the folder
            raise FormatError(f"{path}: {fn} is a symbolic link to {os.path.realpath(fp)}, outside the model "
                              "directory")
        if sha256_file(fp) != digest:
            raise FormatError(f"{path}: checksum mismatch for {fn}: the file was changed or damaged")
    return ModelDir(path, manifest, os.path.join(path, float_file["file"]), entries,
                    None if act is None else os.path.join(path, act["file"]))


__all__ = ["ACT_FILE", "FORMAT", "MANIFEST", "MANIFEST_MAX", "ModelDir", "VERSION", "read_model_dir", "write_model_dir"]
