"""The model directory's manifest (docs/formats.md): opening a directory's files relative to its
descriptor, reading ``manifest.json`` and listing the files it names, every field type-checked.
Shared by the reader (orkpy.formats.modeldir) and the overwrite check, which reads a folder's
manifest before it may replace the folder."""
from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, Dict, List, Optional, Tuple

from .._core import FormatError
from .._io import json_finite_float
from .tiermap import TIERS, split_tier

MANIFEST = "manifest.json"
FORMAT = "orkpy-quantized-model"
VERSION = 1
MANIFEST_MAX = 64 << 20


def tier_ok(tier: object) -> bool:
    """A manifest tier: a base tier, or an integer tier with a group size (orkpy.formats.tiermap.split_tier)."""
    try:
        return isinstance(tier, str) and split_tier(tier)[0] in TIERS
    except ValueError:
        return False


def no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: a FIFO must not block the open; O_NOFOLLOW: links are resolved by open_in itself
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | _O_CLOEXEC
_MAX_LINKS = 8


class Vanished(FormatError):
    """A file (or the directory) is gone: a concurrent save may have replaced the directory."""


def plain_name(fn: object) -> bool:
    return isinstance(fn, str) and fn not in ("", ".", "..") and "/" not in fn and "\0" not in fn


def open_in(dfd: int, fn: str, path: str) -> Tuple[int, os.stat_result]:
    """(descriptor, fstat) of the regular file ``fn`` of the directory open as ``dfd`` (opened relative
    to it, never by path). A symbolic link is followed only when it names another file of the same
    directory by a plain name; any other link is refused (a directory cannot make orkpy read files
    elsewhere)."""
    name = fn
    for _ in range(_MAX_LINKS + 1):
        try:
            fd = os.open(name, _OPEN_FLAGS, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:  # a symbolic link (O_NOFOLLOW)
                try:
                    target = os.readlink(name, dir_fd=dfd)
                except FileNotFoundError:
                    raise Vanished(f"{path}: {fn} is missing or not a regular file") from None
                except OSError:  # no longer a link: open it again
                    continue
                if not plain_name(target):
                    raise FormatError(f"{path}: {fn} is a symbolic link to {target}, outside the model directory "
                                      "(a link may name only another file of the directory)") from None
                name = target
                continue
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                raise Vanished(f"{path}: {fn} is missing or not a regular file") from None
            raise FormatError(f"{path}: cannot open {fn} ({e.strerror or e})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FormatError(f"{path}: {fn} is missing or not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd, st
    raise FormatError(f"{path}: {fn}: more than {_MAX_LINKS} symbolic links in a row")


def read_manifest(dfd: int, path: str) -> Dict[str, Any]:
    """The manifest of the directory open as ``dfd``, parsed, its format and version checked."""
    mpath = os.path.join(path, MANIFEST)
    try:
        fd, st = open_in(dfd, MANIFEST, path)
    except Vanished:
        raise Vanished(f"{path}: no {MANIFEST}: not an orkpy quantized model directory") from None
    try:
        if st.st_size > MANIFEST_MAX:
            raise FormatError(f"{mpath}: not a regular file of at most {MANIFEST_MAX >> 20} MiB")
        chunks: List[bytes] = []
        n = 0
        while n <= MANIFEST_MAX:
            b = os.read(fd, min(1 << 20, MANIFEST_MAX + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
        raw = b"".join(chunks)
    except OSError as e:
        raise FormatError(f"{mpath}: cannot read the manifest ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if len(raw) > MANIFEST_MAX:
        raise FormatError(f"{mpath}: not a regular file of at most {MANIFEST_MAX >> 20} MiB")
    try:
        manifest = json.loads(raw.decode("utf-8"), parse_constant=no_constant, parse_float=json_finite_float)
    except (ValueError, RecursionError) as e:  # bad UTF-8 / JSON, an integer too long, nesting too deep
        raise FormatError(f"{mpath}: not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FormatError(f"{mpath}: not an orkpy quantized model manifest")
    version = manifest.get("version")
    if type(version) is not int or version != VERSION:  # not true, not 1.0
        newer = type(version) is int and version > VERSION
        raise FormatError(f"{mpath}: manifest version {version!r}; this orkpy reads version "
                          f"{VERSION}: " + ("upgrade orkpy (pip install -U orkpy), or quantize the model again with "
                                            "this one" if newer else "quantize the model again with this orkpy "
                                            "(orkpy quantize SOURCE ... --recipe THIS_DIR reuses its recipe)"))
    return manifest


def listed_files(manifest: Dict[str, Any], mpath: str
                  ) -> Tuple[List[Tuple[str, str]], Dict[str, Any], Dict[str, Any], Optional[Dict[str, Any]]]:
    """The manifest's files ((name, sha256): float.gguf, act_scales.json, the packed linears), its
    ``tensors``, ``float_file`` and ``act_scales`` records, every field type-checked."""
    def field_(obj: Any, key: str, typ: type, where: str) -> Any:
        v = obj.get(key)
        if not isinstance(v, typ) or isinstance(v, bool):
            raise FormatError(f"{mpath}: {where}{key!r} is missing or not a JSON {typ.__name__}")
        return v
    entries = field_(manifest, "tensors", dict, "")
    float_file = field_(manifest, "float_file", dict, "")
    files = [(field_(float_file, "file", str, "float_file "), field_(float_file, "sha256", str, "float_file "))]
    act = manifest.get("act_scales")
    if act is not None:
        if not isinstance(act, dict):
            raise FormatError(f"{mpath}: 'act_scales' must be null or {{file: string, sha256: string}}")
        files.append((field_(act, "file", str, "act_scales "), field_(act, "sha256", str, "act_scales ")))
    for name, ent in entries.items():
        where = f"tensor {name!r} "
        if not isinstance(ent, dict):
            raise FormatError(f"{mpath}: {where}entry is not a JSON object")
        shape = field_(ent, "shape", list, where)
        if len(shape) != 2 or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise FormatError(f"{mpath}: {where}shape {shape!r} is not two integers")
        field_(ent, "kind", str, where)
        if not tier_ok(ent.get("tier")):
            raise FormatError(f"{mpath}: tensor {name!r} tier {ent.get('tier')!r} is not one of "
                              f"{', '.join(TIERS)} (the integer tiers optionally with a group size, 'int4-g32')")
        if ent["tier"] == "float":  # its weight is a tensor of float.gguf, covered by that file's checksum
            field_(ent, "tensor", str, where)
            if ent["kind"] != "float":
                raise FormatError(f"{mpath}: {where}of tier 'float' has kind {ent['kind']!r}, not 'float'")
            continue
        files.append((field_(ent, "file", str, where), field_(ent, "sha256", str, where)))
    for fn, _ in files:
        if not plain_name(fn) or fn == MANIFEST:
            raise FormatError(f"{mpath}: bad file name {fn!r}")
    return files, entries, float_file, act


__all__ = ["FORMAT", "MANIFEST", "MANIFEST_MAX", "VERSION", "Vanished", "listed_files", "no_constant", "open_in",
           "plain_name", "read_manifest", "tier_ok"]
