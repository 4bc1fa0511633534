"""Issue 13, items 3-6: concurrent writers to one path, tier-map names that
round-trip, the model-directory manifest inside the FormatError contract, and
strict tier-map parsing (a map that does not fit the model is an error)."""
import hashlib
import json
import os
import threading

import numpy as np
import pytest

import orkpy
import orkpy.formats.modeldir as modeldir
from orkpy import FormatError, TierEntry, TierMap
from orkpy.quantization.calibrate import quantize_model
from orkpy.quantization.imatrix import Imatrix
from orkpy.kernels.packed import pack, save_packed

ST = "models/stories260K"


def _hammer(writers, rounds=12):
    """Run each writer (a callable of the round number) in its own thread, all
    starting each round together; return the exceptions raised."""
    errors = []
    barrier = threading.Barrier(len(writers))

    def run(w):
        for r in range(rounds):
            barrier.wait()
            try:
                w(r)
            except BaseException as e:  # noqa: B036 - collected and asserted on
                errors.append(e)
    ts = [threading.Thread(target=run, args=(w,)) for w in writers]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors


def _payloads(tmp_path, save, objs, ext):
    out = []
    for i, o in enumerate(objs):
        p = tmp_path / f"ref{i}{ext}"
        save(o, p)
        out.append(p.read_bytes())
        p.unlink()
    assert len(set(out)) == len(out)
    return out


# ---------------------------------------------------------------- item 3 --

@pytest.mark.parametrize("what", ["packed", "tiermap", "imatrix", "gguf"])
def test_threads_saving_one_path(tmp_path, what):
    rng = np.random.default_rng(7)
    n = 4
    if what == "packed":
        objs = [pack(orkpy.quantize(rng.standard_normal((256, 512)).astype(np.float32), "int8")) for _ in range(n)]
        save, ext = save_packed, ".o8n1"
    elif what == "tiermap":
        objs = [TierMap({f"t{i}.{j}": TierEntry("int4", "Q4_K", (32, 256)) for j in range(2000)}) for i in range(n)]
        save, ext = (lambda o, p: o.save(p)), ".txt"
    elif what == "imatrix":
        objs = []
        for i in range(n):
            im = Imatrix(chunks=i + 1)
            for j in range(16):
                im.add(f"blk.{j}.ffn_up.weight", rng.random(4096), 10)
            objs.append(im)
        save, ext = (lambda o, p: o.save(p)), ".gguf"
    else:
        from orkpy.formats.gguf_write import write_gguf
        objs = [[("w", rng.standard_normal((64, 1024)).astype(np.float32))] for _ in range(n)]
        save, ext = (lambda o, p: write_gguf(p, [], o)), ".gguf"
    want = _payloads(tmp_path, save, objs, ext)
    target = tmp_path / f"out{ext}"
    errors = _hammer([lambda r, o=o: save(o, target) for o in objs])
    assert errors == []
    assert target.read_bytes() in want                   # one complete payload, never a mix
    assert os.listdir(tmp_path) == [target.name]         # no temp file left behind


def test_atomic_open_keeps_default_permissions(tmp_path):
    from orkpy._io import atomic_write
    p = tmp_path / "f.bin"
    atomic_write(p, [b"x"])
    (tmp_path / "g.bin").write_bytes(b"x")
    assert os.stat(p).st_mode == os.stat(tmp_path / "g.bin").st_mode


def test_atomic_open_failure_leaves_nothing(tmp_path):
    from orkpy._io import atomic_open
    with pytest.raises(RuntimeError):
        with atomic_open(tmp_path / "f.bin") as f:
            f.write(b"partial")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def _direct_cases():
    from orkpy._io import DIRECT_ALIGN, DIRECT_MIN, DIRECT_STAGE
    return [(0, 0), (5, 0), (5000, 300), (DIRECT_MIN - 1, 0), (DIRECT_MIN - 1, DIRECT_ALIGN), (DIRECT_MIN, 0),
            (DIRECT_MIN + 1, 100),
            (DIRECT_STAGE, 0), (DIRECT_STAGE + 1, DIRECT_ALIGN), (3 * DIRECT_STAGE - 7, 5000),
            (2 * DIRECT_STAGE + 3, DIRECT_STAGE + 9)]


@pytest.mark.parametrize("n,head", _direct_cases())
def test_direct_write_writes_the_bytes(tmp_path, n, head, monkeypatch):
    """atomic_write(direct=True): the same file as a plain write for any length (empty, shorter than
    DIRECT_MIN, around the staging buffer's size) and head (the bytes through the page cache, also
    longer than the staging buffer), from chunks of odd sizes and types; the direct writes are
    aligned (address, offset and length) when the file system takes them."""
    from orkpy import _io
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    cuts = sorted({0, n, *[min(n, c) for c in (1, 4095, 70000, n // 3, n - 2 if n > 2 else 0)]})
    chunks = [data[a:b] for a, b in zip(cuts, cuts[1:])]
    chunks = [bytearray(c) if i % 3 == 1 else (memoryview(c) if i % 3 == 2 else c) for i, c in enumerate(chunks)]
    writes, real_write = [], os.write

    def write(fd, b):
        import fcntl
        k = real_write(fd, b)
        writes.append((bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT), os.lseek(fd, 0, os.SEEK_CUR) - k, len(b)))
        return k
    monkeypatch.setattr(_io.os, "write", write)
    h = hashlib.sha256()
    _io.atomic_write(tmp_path / "f.bin", iter(chunks), durable=bool(n % 2), direct=True, head=head, hasher=h)
    assert (tmp_path / "f.bin").read_bytes() == data and os.listdir(tmp_path) == ["f.bin"]
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()  # hashed as written, chunks in order
    h2 = hashlib.sha256()
    _io.atomic_write(tmp_path / "g.bin", iter(chunks), direct=False, hasher=h2)
    assert (tmp_path / "g.bin").read_bytes() == data and h2.hexdigest() == h.hexdigest()
    os.unlink(tmp_path / "g.bin")
    for d, off, ln in writes:
        assert not d or (off % _io.DIRECT_ALIGN == 0 and ln % _io.DIRECT_ALIGN == 0), (d, off, ln)
        if d:
            assert off >= head  # the head goes through the page cache
    if n < _io.DIRECT_MIN:  # a short file (with a head too) goes through the page cache
        assert not any(d for d, _, _ in writes)
    elif n >= -(-head // _io.DIRECT_ALIGN) * _io.DIRECT_ALIGN + _io.DIRECT_STAGE and _direct_io(tmp_path):
        assert any(d for d, _, _ in writes)  # where the file system takes O_DIRECT, the body went direct


def _direct_io(folder):
    """Whether files in ``folder`` take an aligned O_DIRECT write."""
    import mmap
    p = os.path.join(folder, ".direct-probe")
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    try:
        buf = mmap.mmap(-1, 4096)
        os.write(fd, buf)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        os.unlink(p)


def test_direct_write_falls_back_when_refused(tmp_path, monkeypatch):
    """A file system that refuses O_DIRECT (EINVAL when fcntl sets it, or at the first direct write)
    gets the same bytes through the page cache; another error is raised and leaves nothing."""
    import errno
    from orkpy import _io
    data = np.random.default_rng(1).integers(0, 256, 3 * _io.DIRECT_STAGE + 11, dtype=np.uint8).tobytes()
    real_write = os.write

    def refuse_direct(fd, b):
        import fcntl
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, b)
    monkeypatch.setattr(_io.os, "write", refuse_direct)
    _io.atomic_write(tmp_path / "a.bin", [data], direct=True, head=100)
    assert (tmp_path / "a.bin").read_bytes() == data
    monkeypatch.setattr(_io.os, "write", real_write)
    import fcntl
    real_fcntl = fcntl.fcntl

    def refuse_setfl(fd, cmd, *a):  # F_SETFL refuses O_DIRECT, as Linux does for a file system without it
        if cmd == fcntl.F_SETFL and a and a[0] & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fcntl(fd, cmd, *a)
    monkeypatch.setattr(fcntl, "fcntl", refuse_setfl)
    _io.atomic_write(tmp_path / "b.bin", [data], direct=True)
    assert (tmp_path / "b.bin").read_bytes() == data
    monkeypatch.setattr(fcntl, "fcntl", real_fcntl)

    def full(fd, b):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(_io.os, "write", full)
    with pytest.raises(OSError, match="No space"):
        _io.atomic_write(tmp_path / "c.bin", [data], direct=True)
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_direct_write_on_tmpfs():
    """/dev/shm (tmpfs: O_DIRECT refused on older kernels, taken on newer ones) gets the bytes."""
    from orkpy import _io
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    data = os.urandom(2 * _io.DIRECT_STAGE + 5)
    p = os.path.join("/dev/shm", f"orkpy-direct-{os.getpid()}.bin")
    try:
        _io.atomic_write(p, [data], direct=True, head=3)
        with open(p, "rb") as f:
            assert f.read() == data
    finally:
        if os.path.exists(p):
            os.unlink(p)


def test_in_background_returns_or_raises():
    from orkpy._io import in_background
    assert in_background(lambda: 6 * 7)() == 42

    def boom():
        raise OSError("disk gone")
    result = in_background(boom)
    with pytest.raises(OSError, match="disk gone"):
        result()


def test_streamed_model_dir_hashes_what_it_wrote(shared, tmp_path, monkeypatch):
    """The streaming writer hashes each packed linear from memory while writing it (no read-back)
    and syncs the folder's files once before the rename: the manifest's digests are the files'
    bytes, the source's and allocation's hashes (read in a thread meanwhile) are theirs."""
    from orkpy import _io
    synced = []
    real = _io.fsync_files
    monkeypatch.setattr(modeldir, "fsync_files", lambda d: (synced.append(sorted(os.listdir(d))), real(d)))
    src, alloc = shared / ST / "stories260K-F16.gguf", shared / ST / "stories260K-Q4_0.gguf"
    out = tmp_path / "m"
    quantize_model(src, alloc, kind="nf4", output=out, progress=False, log=lambda m: None)
    man = _manifest(out)
    files = [e["file"] for e in man["tensors"].values() if "file" in e]
    assert len(files) > 5 and len(synced) == 1 and set(files) <= set(synced[0])
    for e in man["tensors"].values():
        if "file" in e:
            assert e["sha256"] == _io.sha256_file(out / e["file"])
    assert man["source"]["sha256"] == _io.sha256_file(src) and man["alloc"]["sha256"] == _io.sha256_file(alloc)
    from orkpy.quantization.calibrate import load_quantized
    load_quantized(out)  # the load checks every digest again


@pytest.fixture(scope="module")
def two_models(shared):
    """Two different quantizations of one small model (distinct directory payloads)."""
    return [quantize_model(shared / ST / "stories260K-F16.gguf", shared / ST / "stories260K-Q4_0.gguf", kind=k,
                           progress=False, log=lambda m: None) for k in ("nf4", "int4")]


def _manifest(d):
    return json.loads((d / "manifest.json").read_text())


@pytest.mark.parametrize("exchange", [True, False])
def test_threads_saving_one_model_dir(two_models, tmp_path, monkeypatch, exchange):
    if not exchange:                                      # the fallback: move aside, then rename
        monkeypatch.setattr(modeldir, "_exchange_dirs", lambda a, b: False)
    refs = tmp_path / "refs"
    want = [_manifest(refs / f"r{i}") for i, qm in enumerate(two_models) if qm.save(refs / f"r{i}")]
    work = tmp_path / "work"
    work.mkdir()
    target = work / "m"
    errors = _hammer([lambda r, qm=qm: qm.save(target, overwrite=True) for qm in two_models], rounds=5)
    assert errors == []
    assert _manifest(target) in want
    orkpy.load_model(target)                              # every checksum holds: one complete model
    assert os.listdir(work) == ["m"]                      # no temp or moved-aside folder left


def test_save_refuses_a_file_a_link_or_a_foreign_folder_first(two_models, tmp_path):
    qm = two_models[0]
    f = tmp_path / "m"
    f.write_bytes(b"not a model")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        qm.save(f, overwrite=True)
    assert f.read_bytes() == b"not a model" and os.listdir(tmp_path) == ["m"]
    f.unlink()
    real = tmp_path / "real"
    qm.save(real)
    f.symlink_to(real)
    with pytest.raises(NotADirectoryError, match="symbolic link"):
        qm.save(f, overwrite=True)
    assert f.is_symlink() and sorted(os.listdir(tmp_path)) == ["m", "real"]
    f.unlink()
    f.mkdir()
    (f / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an orkpy model directory"):
        qm.save(f, overwrite=True)
    assert os.listdir(f) == ["notes.txt"] and sorted(os.listdir(tmp_path)) == ["m", "real"]
    (f / "notes.txt").unlink()
    qm.save(f, overwrite=True)                            # an empty folder is replaced
    orkpy.load_model(f)


# what overwrite may delete: only an orkpy model directory (its manifest, the files it lists, orkpy's
# temp files of those) or an empty folder; anything else is refused before any work, and left intact

WEB_EXTENSION = {"manifest.json": b'{"manifest_version": 3, "name": "tab saver", "version": "1.0",\n'
                                  b' "background": {"service_worker": "src/background.js"}}\n',
                 "src/background.js": b"chrome.runtime.onInstalled.addListener(() => {});\n"}


def _tree(d):
    """{relative path: bytes} of every file under ``d``."""
    out = {}
    for root, _, fns in os.walk(d):
        for fn in fns:
            p = os.path.join(root, fn)
            out[os.path.relpath(p, d)] = open(p, "rb").read()
    return out


def _make_tree(d, files):
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
        with open(os.path.join(d, rel), "wb") as f:
            f.write(data)


def _no_work(monkeypatch):
    """Fail if quantize_model gets past its first stage (the overwrite check comes before it)."""
    import orkpy.quantization.pipeline as pipeline
    monkeypatch.setattr(pipeline, "open_stage", lambda *a, **k: pytest.fail("work began before the overwrite check"))


def _overwrite_with(how, two_models, shared, out, monkeypatch=None):
    """Replace ``out`` with a model: QuantizedModel.save, quantize_model(output=), or the CLI."""
    if how == "save":
        return two_models[1].save(out, overwrite=True)
    src, alloc = shared / ST / "stories260K-F16.gguf", shared / ST / "stories260K-Q4_0.gguf"
    if how == "quantize_model":
        return quantize_model(src, alloc, kind="int4", output=out, overwrite=True, progress=False,
                              log=lambda m: None).path
    from orkpy.cli import main
    rc = main(["quantize", str(src), "--alloc", str(alloc), "--kind", "int4", "-o", str(out), "--overwrite",
               "--no-progress"])
    if rc != 0:
        raise FileExistsError(f"exit status {rc}")
    return str(out)


@pytest.mark.parametrize("how", ["save", "quantize_model", "cli"])
def test_overwrite_refuses_a_folder_with_a_foreign_manifest(two_models, shared, tmp_path, monkeypatch, capsys, how):
    """A web extension (manifest.json + src/background.js) is not an orkpy model directory: save,
    quantize_model(output=) and orkpy quantize -o --overwrite refuse it, before any work, and it stays
    as it was (before the fix its files were deleted)."""
    out = tmp_path / "ext"
    _make_tree(out, WEB_EXTENSION)
    _no_work(monkeypatch)
    with pytest.raises(FileExistsError) as e:
        _overwrite_with(how, two_models, shared, out)
    msg = capsys.readouterr().err if how == "cli" else str(e.value)
    assert str(out) in msg and "not an orkpy model directory: manifest.json is not orkpy's" in msg, msg
    assert _tree(out) == WEB_EXTENSION and os.listdir(tmp_path) == ["ext"]


@pytest.mark.parametrize("how", ["save", "quantize_model", "cli"])
def test_overwrite_refuses_a_model_directory_holding_other_files(two_models, shared, tmp_path, monkeypatch, capsys,
                                                                 how):
    """An orkpy manifest is not enough: a folder holding files the manifest does not list (a folder of
    sources, notes) is refused, naming them, and left intact."""
    out = tmp_path / "m"
    two_models[0].save(out)
    _make_tree(out, {"notes.txt": b"mine", "src/background.js": b"// mine"})
    before = _tree(out)
    _no_work(monkeypatch)
    with pytest.raises(FileExistsError) as e:
        _overwrite_with(how, two_models, shared, out)
    msg = capsys.readouterr().err if how == "cli" else str(e.value)
    assert f"{out}: holds files orkpy did not write: notes.txt, src/" in msg, msg
    assert _tree(out) == before and os.listdir(tmp_path) == ["m"]


@pytest.mark.parametrize("how", ["save", "quantize_model", "cli"])
def test_overwrite_replaces_an_orkpy_model_directory(two_models, shared, tmp_path, how):
    """A genuine model directory -- also one holding a temp file orkpy's writer left (kill -9) or
    missing a listed file -- is replaced: the new model, nothing of the old one left."""
    out = tmp_path / "m"
    two_models[0].save(out)
    old = _manifest(out)
    (out / ".float.gguf.tmp-123-456-0123abcd").write_bytes(b"partial")
    os.remove(out / next(e["file"] for e in old["tensors"].values() if "file" in e))
    assert _overwrite_with(how, two_models, shared, out) == str(out)
    new = _manifest(out)
    assert new != old and os.listdir(tmp_path) == ["m"]
    listed = {new["float_file"]["file"]} | {e["file"] for e in new["tensors"].values() if "file" in e}
    if new.get("act_scales"):
        listed.add(new["act_scales"]["file"])
    assert set(os.listdir(out)) == listed | {"manifest.json"}
    orkpy.load_model(out)


@pytest.mark.parametrize("exchange", [True, False])
def test_a_folder_changed_after_the_check_is_put_back(two_models, tmp_path, monkeypatch, exchange):
    """A file written into the old model directory between the overwrite check and the swap: what
    came out of the way is checked again before anything is deleted, and put back."""
    a, b = two_models
    out = tmp_path / "m"
    a.save(out)
    real = modeldir._exchange_dirs

    def exchange_after_a_write(x, y):
        (out / "added-meanwhile.txt").write_text("mine")
        return real(x, y) if exchange else False
    monkeypatch.setattr(modeldir, "_exchange_dirs", exchange_after_a_write)
    before = _manifest(out)
    with pytest.raises(FileExistsError, match="holds files orkpy did not write: added-meanwhile.txt"):
        b.save(out, overwrite=True)
    assert _manifest(out) == before and (out / "added-meanwhile.txt").read_text() == "mine"
    assert os.listdir(tmp_path) == ["m"]                  # no temp folder left, nothing lost
    monkeypatch.undo()
    (out / "added-meanwhile.txt").unlink()
    orkpy.load_model(out)


def test_save_error_after_moving_the_old_model_aside_restores_it(two_models, tmp_path, monkeypatch):
    monkeypatch.setattr(modeldir, "_exchange_dirs", lambda a, b: False)   # no RENAME_EXCHANGE here
    a, b = two_models
    target = tmp_path / "m"
    a.save(target)
    before = _manifest(target)
    real_rename, calls = os.rename, []

    def rename(src, dst):
        if os.path.basename(src).startswith(".m.tmp-") and os.fspath(dst) == str(target):
            calls.append(src)
            if len(calls) == 2 and src == calls[0]:       # the install after the old model moved aside
                raise OSError(5, "simulated I/O error")
        return real_rename(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="simulated"):
        b.save(target, overwrite=True)
    monkeypatch.setattr(os, "rename", real_rename)
    assert len(calls) == 3                                # install, install (fails), restore
    assert _manifest(target) == before and os.listdir(tmp_path) == ["m"]
    orkpy.load_model(target)


# ---------------------------------------------------------------- item 4 --

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402

from ggufgen import FLOAT32, build  # noqa: E402

# names the GGUF reader returns: any bytes, undecodable ones as surrogate escapes
_reader_names = hs.binary(min_size=1, max_size=63).map(lambda b: b.decode("utf-8", "surrogateescape"))
_NASTY = ["#lead", "#", "a\tb", "a\nb", "a\rb", "a\r\nb", "a\x0bb", "a\x0cb", "a\x1cb", "a\x85b", "a\u2028b",
          "a\u2029b", "\udcff\udcfe", "x\udcc3", "%41", "%", "100%", " lead", "trail ", "\x00", "\x7f\x9f", "é",
          "\ufeffbom", "blk.0.attn_q.weight"]


def _round_trip(tm, path):
    tm.save(path)
    back = TierMap.load(path)
    assert back == tm and list(back.entries) == list(tm.entries) and back.source == tm.source
    return back


def test_tier_map_round_trips_nasty_names_from_a_gguf(tmp_path):
    tensors = [(n.encode("utf-8", "surrogateescape"), (32,), FLOAT32, bytes(128)) for n in _NASTY]
    tensors.append((b"#w\n2d", (32, 4), FLOAT32, bytes(512)))
    data, _ = build([], tensors)
    (tmp_path / "m.gguf").write_bytes(data)
    g = orkpy.GGUFFile(tmp_path / "m.gguf")
    names = [t.name for t in g.tensors]
    assert names == _NASTY + ["#w\n2d"]
    tm = orkpy.tier_map(g, embeddings="int4")
    back = _round_trip(tm, tmp_path / "m.map")
    assert list(back) == names and back["#w\n2d"] == "int8"
    text = (tmp_path / "m.map").read_text(encoding="utf-8")
    assert len(text.splitlines()) == 5 + len(names)      # every entry on one line of its own


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=hs.lists(_reader_names, min_size=1, max_size=8, unique=True),
       source=hs.one_of(hs.none(), _reader_names, hs.text(min_size=1)))
def test_tier_map_round_trips_any_reader_name(tmp_path, names, source):
    tm = TierMap({n: TierEntry(("int8", "int4", "float")[i % 3], "Q4_K", (2, 256)) for i, n in enumerate(names)},
                 source=source)
    _round_trip(tm, tmp_path / "h.map")


def test_tier_map_v1_files_still_load_with_literal_names(tmp_path):
    p = tmp_path / "v1.map"
    p.write_text("# orkpy tier map v1\n# threshold: 4.5\na%41\tint4\tQ4_K\t2x256\n")
    tm = TierMap.load(p)
    assert list(tm) == ["a%41"] and tm.threshold == 4.5
    _round_trip(tm, tmp_path / "v2.map")
    assert "a%2541\t" in (tmp_path / "v2.map").read_text()


def test_tier_map_refuses_names_no_bytes_decode_to():
    with pytest.raises(ValueError, match="lone surrogate"):
        TierMap({"a\ud800": TierEntry("float", "F32", (4,))})
    with pytest.raises(ValueError, match="non-empty str"):
        TierMap({"": TierEntry("float", "F32", (4,))})


# ---------------------------------------------------------------- item 6 --

_V2 = "# orkpy tier map v2\n"


@pytest.mark.parametrize("body, match", [
    ("# threshold: nan\n", ":2: bad threshold 'nan'"),
    ("# threshold: -inf\n", ":2: bad threshold '-inf'"),
    ("# threshold: inf\n", ":2: bad threshold 'inf'"),
    ("# threshold: 1e400\n", ":2: bad threshold"),
    ("# threshold: 0\n", ":2: bad threshold '0'"),
    ("# threshold: 64.0\n", ":2: bad threshold"),
    ("# threshold: 5_0\n", ":2: bad threshold '5_0'"),
    ("# threshold: \uff15\n", ":2: bad threshold"),
    ("# threshold: +3\n", ":2: bad threshold '\\+3'"),
    ("# threshold: 5.0\n# threshold: 4.0\n", ":3: second 'threshold' header"),
    ("# tied: true\n\n# tied: false\n", ":4: second 'tied' header"),
    ("a\tint4\tQ4_K\t1_0x256\n", ":2: bad shape '1_0x256'"),
    ("a\tint4\tQ4_K\t\uff11x256\n", ":2: bad shape"),
    ("a\tint4\tQ4_K\t +3x256\n", ":2: bad shape ' \\+3x256'"),
    ("a\tint4\tQ4_K\t+3x256\n", ":2: bad shape"),
    ("a\tint4\tQ4_K\t3x256 \n", ":2: bad shape"),
    ("a\tint4\tQ4_K\t03x256\n", ":2: bad shape '03x256'"),
    ("a\tint4\tQ4_K\t-3x256\n", ":2: bad shape"),
    ("a\tfloat\tF32\t1x1x1x1x1\n", ":2: bad shape"),
    ("a\tfloat\tF32\t9223372036854775808\n", ":2: bad shape"),
    ("a\tfloat\tF32\t4294967296x4294967296\n", ":2: bad shape"),
    ("a\tint4\tF32\t256\n", ":2: tier 'int4' needs a 2-D weight"),
    ("a\tint8\tQ4_K\t2x2x256\n", ":2: tier 'int8' needs a 2-D weight"),
    ("a\tint4 \tQ4_K\t2x256\n", ":2: unknown tier 'int4 '"),
    ("a\tint4\tq4_k\t2x256\n", ":2: unknown ggml type 'q4_k'"),
    (_V2 + "a%4\tint4\tQ4_K\t2x256\n", ":2: tensor name 'a%4': bad escape"),
    (_V2 + "a%zz\tint4\tQ4_K\t2x256\n", ":2: tensor name 'a%zz': bad escape"),
    (_V2 + "%61\tint4\tQ4_K\t2x256\na\tint4\tQ4_K\t2x256\n", ":3: duplicate tensor 'a'"),
])
def test_tier_map_strict_parsing(tmp_path, body, match):
    p = tmp_path / "m.map"
    head = "" if body.startswith("# orkpy") else "# orkpy tier map v1\n"   # v1: what the previous loader read
    p.write_text(head + body, encoding="utf-8")
    with pytest.raises(FormatError, match=match):
        TierMap.load(p)
    if not head:
        return
    p.write_text(_V2 + body, encoding="utf-8")              # the same rules for v2
    with pytest.raises(FormatError, match=match):
        TierMap.load(p)


def test_tier_map_constructor_holds_the_same_rules():
    for thr in (float("nan"), float("inf"), -1.0, 0.0, 64.0):
        with pytest.raises(ValueError, match="threshold"):
            TierMap({}, threshold=thr)
    with pytest.raises(ValueError, match="needs a 2-D weight"):
        TierMap({"n": TierEntry("int8", "F32", (64,))})
    with pytest.raises(ValueError, match="bad shape"):
        TierMap({"n": TierEntry("float", "F32", (0, 64))})


def test_float_type_with_an_int4_tier_is_an_override_not_an_error(shared, tmp_path):
    # an F16 source's embedding table allocated int4 by embeddings="int4": a map tier_map itself makes
    tm = orkpy.tier_map(shared / ST / "stories260K-F16.gguf", embeddings="int4")
    assert tm.entries["token_embd.weight"].ggml_type == "F16" and tm["token_embd.weight"] == "int4"
    _round_trip(tm, tmp_path / "m.map")


def _edited(tm, **changes):
    entries = dict(tm.entries)
    for n, e in changes.items():
        if e is None:
            del entries[n]
        else:
            entries[n] = e
    return TierMap(entries, threshold=tm.threshold, source=tm.source, tied=tm.tied)


@pytest.mark.parametrize("change, match", [
    ({"nope.weight": TierEntry("int4", "Q4_0", (64, 64))}, "entry 'nope.weight' names a tensor"),
    ({"blk.0.attn_q.weight": TierEntry("int4", "Q4_0", (999, 999))},
     "entry 'blk.0.attn_q.weight' has shape 999x999"),
    ({"blk.1.attn_norm.weight": TierEntry("float", "F32", (999,))}, "entry 'blk.1.attn_norm.weight' has shape 999,"),
    ({"blk.2.ffn_up.weight": None}, "no entry for 'blk.2.ffn_up.weight'"),
])
def test_a_map_that_does_not_fit_the_model_is_an_error(shared, tmp_path, change, match):
    tm = _edited(orkpy.tier_map(shared / ST / "stories260K-Q4_0.gguf"), **change)
    with pytest.raises(ValueError, match=match):
        orkpy.load_model(shared / ST / "stories260K-F32.gguf", weights=tm)
    with pytest.raises(ValueError, match="allocation.*" + match):
        quantize_model(shared / ST / "stories260K-F16.gguf", tm, progress=False, log=lambda m: None)
    tm.save(tmp_path / "m.map")                          # the same map as a file: the same refusal
    with pytest.raises(ValueError, match=match):
        quantize_model(shared / ST / "stories260K-F16.gguf", tmp_path / "m.map", progress=False, log=lambda m: None)


# ---------------------------------------------------------------- item 5 --

@pytest.fixture
def saved(two_models, tmp_path):
    return two_models[0].save(tmp_path / "m")


def _rewrite(d, edit):
    mp = os.path.join(d, "manifest.json")
    man = json.loads(open(mp).read())
    edit(man)
    with open(mp, "w") as f:
        f.write(json.dumps(man))


def test_manifest_that_is_a_directory_or_a_fifo(saved):
    mp = os.path.join(saved, "manifest.json")
    os.remove(mp)
    os.mkdir(mp)
    with pytest.raises(FormatError, match="manifest.json"):
        orkpy.load_model(saved)
    os.rmdir(mp)
    os.mkfifo(mp)                                        # open() would block for ever
    with pytest.raises(FormatError, match="not a regular file"):
        orkpy.load_model(saved)


def test_manifest_nested_too_deep_or_too_big(saved):
    mp = os.path.join(saved, "manifest.json")
    with open(mp, "w") as f:
        f.write("[" * 100000 + "]" * 100000)
    with pytest.raises(FormatError, match="not valid JSON"):
        orkpy.load_model(saved)
    with open(mp, "wb") as f:
        f.truncate((64 << 20) + 1)
    with pytest.raises(FormatError, match="at most 64 MiB"):
        orkpy.load_model(saved)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.update(version=True), "manifest version True; this orkpy reads version 1: quantize the model again"),
    (lambda m: m.update(version=1.0), "manifest version 1.0; this orkpy"),
    (lambda m: m.update(version="1"), "manifest version '1'; this orkpy"),
    (lambda m: m.update(version=2), "manifest version 2; this orkpy reads version 1: upgrade orkpy"),
    (lambda m: m["tensors"]["blk.0.attn_q.weight"].update(shape=[True, 64]), "shape"),
    (lambda m: m["tensors"]["blk.0.attn_q.weight"].update(file=["x"]), "'file'"),
    (lambda m: m["tensors"]["blk.0.attn_q.weight"].update(sha256=None), "'sha256'"),
    (lambda m: m["tensors"]["blk.0.attn_q.weight"].update(tier="int3"), "tier 'int3'"),
    (lambda m: m.update(tensors=[]), "'tensors'"),
    (lambda m: m.update(float_file="float.gguf"), "'float_file'"),
    (lambda m: m.update(double_quant=0), "'double_quant'"),
    (lambda m: m.update(int8_share=True), "'int8_share'"),
    (lambda m: m.update(int8_share="0.5"), "'int8_share'"),
    (lambda m: m.update(imatrix={"sha256": "x", "chunks": False}), "'imatrix'"),
    (lambda m: m.update(source="x.gguf"), "'source'"),
    (lambda m: m.update(settings=None), "'settings'"),
    (lambda m: m.update(alloc=[]), "'alloc'"),
])
def test_manifest_fields_are_type_checked(saved, edit, match):
    orkpy.load_model(saved)
    _rewrite(saved, edit)
    with pytest.raises(FormatError, match=match):
        orkpy.load_model(saved)


def test_manifest_nan_is_not_a_number(saved):
    mp = os.path.join(saved, "manifest.json")
    text = open(mp).read()
    share = json.loads(text)["int8_share"]
    with open(mp, "w") as f:
        f.write(text.replace(f'"int8_share": {share!r}', '"int8_share": NaN'))
    with pytest.raises(FormatError, match="NaN is not a JSON number"):
        orkpy.load_model(saved)


def test_tensor_file_symlinked_out_of_the_directory_is_refused(saved, tmp_path):
    fn = "blk.0.attn_q.weight.o4n1"
    outside = tmp_path / "outside.o4n1"
    os.replace(os.path.join(saved, fn), outside)
    os.symlink(outside, os.path.join(saved, fn))         # same bytes, same checksum: still refused
    with pytest.raises(FormatError, match="symbolic link to .*outside the model directory"):
        orkpy.load_model(saved)
    os.remove(os.path.join(saved, fn))
    os.replace(outside, os.path.join(saved, "data.bin"))
    os.symlink("data.bin", os.path.join(saved, fn))      # a link within the folder is followed
    orkpy.load_model(saved)
