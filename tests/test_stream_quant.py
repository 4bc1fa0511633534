"""Streaming quantization (issue 18 item 1): quantize_model(output=) writes each linear as it is
made, holds it only as a mapping of the written file, releases the source's pages after each
tensor, and gives the same directory as quantize_model(...).save(); MappedFile.release and
gguf_write.LazyTensor, the two pieces it stands on."""
import filecmp
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import orkpy
from orkpy._core import MappedFile
from orkpy._mapped import maps_of
from orkpy.formats.gguf_write import LazyTensor, write_gguf

STORIES = "models/stories260K/stories260K-F16.gguf"
Q4_0 = "models/stories260K/stories260K-Q4_0.gguf"
QUIET = dict(progress=False, log=lambda s: None)


def _vm(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    pytest.skip(f"/proc/self/status has no {key}")


def test_streamed_directory_equals_the_saved_one(shared, tmp_path):
    src, alloc = shared / STORIES, shared / Q4_0
    qm = orkpy.quantize_model(src, alloc, **QUIET)
    qm.save(tmp_path / "saved")
    qs = orkpy.quantize_model(src, alloc, output=tmp_path / "streamed", **QUIET)
    assert qm.path is None and qs.path == str(tmp_path / "streamed")
    names = sorted(os.listdir(tmp_path / "saved"))
    assert names == sorted(os.listdir(tmp_path / "streamed")) and "manifest.json" in names
    for n in names:
        assert filecmp.cmp(tmp_path / "saved" / n, tmp_path / "streamed" / n, shallow=False), n
    # every packed linear of the result is a mapping of its written file (opened in the writer's
    # temporary folder, renamed into place since), not a copy in memory
    for name, pw in qs.tensors.items():
        files = [m.path for m in maps_of(pw.store)]
        assert len(files) == 1 and os.path.basename(files[0]).startswith(name + ".o"), name
    toks = np.arange(1, 40, dtype=np.int32)
    ref = qm.to_model().forward(toks)
    assert np.array_equal(qs.to_model().forward(toks), ref)
    assert np.array_equal(orkpy.load_model(qs.path).forward(toks), ref)


def test_streaming_refuses_an_existing_output_first_and_cleans_up_on_error(shared, tmp_path):
    src, alloc = shared / STORIES, shared / Q4_0
    out = tmp_path / "m"
    orkpy.quantize_model(src, shared / "models/stories260K/stories260K-Q8_0.gguf", **QUIET).save(out)
    with pytest.raises(FileExistsError, match="exists"):
        orkpy.quantize_model(src, alloc, output=out, **QUIET)
    assert sorted(os.listdir(tmp_path)) == ["m"]
    # an imatrix for another model fails on the first 4-bit linear: nothing is left behind
    im = orkpy.Imatrix().add("blk.0.attn_q.weight", np.ones(7), 1)
    with pytest.raises(ValueError, match="imatrix"):
        orkpy.quantize_model(src, alloc, imatrix=im, output=tmp_path / "n", **QUIET)
    assert sorted(os.listdir(tmp_path)) == ["m"]
    qs = orkpy.quantize_model(src, alloc, output=out, overwrite=True, **QUIET)
    assert qs.path == str(out) and sorted(os.listdir(tmp_path)) == ["m"]
    tiers = {e["tier"] for e in json.loads((out / "manifest.json").read_text())["tensors"].values()}
    assert "int4" in tiers  # the Q4_0 allocation replaced the all-int8 model


def test_mapped_file_release_drops_pages_and_keeps_values(tmp_path):
    p = tmp_path / "big.bin"
    data = np.random.default_rng(0).integers(0, 255, 48 << 20, dtype=np.uint8)
    data.tofile(p)
    m = MappedFile(p)
    a = np.frombuffer(m, np.uint8)
    before = _vm("VmRSS")
    s = int(a.sum(dtype=np.uint64))  # pages every byte in
    touched = _vm("VmRSS")
    m.release()
    after = _vm("VmRSS")
    assert touched - before > (32 << 20) and touched - after > (32 << 20)
    assert int(a.sum(dtype=np.uint64)) == s and np.array_equal(a[:4096], data[:4096])
    m.release(5, 10)
    m.release(len(m) + 10)  # past the end: nothing to drop
    with pytest.raises(ValueError, match="offset"):
        m.release(-1)
    with pytest.raises(ValueError, match="length"):
        m.release(0, -2)
    del a
    m.close()
    with pytest.raises(ValueError):
        m.release()


def test_lazy_tensors_are_written_like_arrays(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((2, 5), 2, np.float16)
    calls = []

    def make():
        calls.append(1)
        return b.copy()
    write_gguf(tmp_path / "eager.gguf", [], [("a", a), ("b", b)])
    write_gguf(tmp_path / "lazy.gguf", [], [("a", LazyTensor(a.shape, a.dtype, lambda: a)),
                                            ("b", LazyTensor((2, 5), np.float16, make))])
    assert calls == [1]
    assert (tmp_path / "eager.gguf").read_bytes() == (tmp_path / "lazy.gguf").read_bytes()
    with pytest.raises(ValueError, match=r"tensor 'b': make\(\) gave float16 \(2, 4\), declared float16 \(2, 5\)"):
        write_gguf(tmp_path / "bad.gguf", [], [("b", LazyTensor((2, 5), np.float16, lambda: b[:, :4].copy()))])
    assert sorted(os.listdir(tmp_path)) == ["eager.gguf", "lazy.gguf"]  # the failed write left nothing


@pytest.mark.slow
def test_streamed_quantization_peak_memory_does_not_hold_the_model(tmp_path):
    """A 4-layer model of 2048 x 8192 FFNs (302 MB of F16 weights): streamed, the peak resident
    set grows by far less than the model; the in-memory path (quantize_model + save) holds it."""
    script = textwrap.dedent(f"""
        import sys, numpy as np
        sys.path.insert(0, {os.path.join(os.path.dirname(__file__), '..', 'bench')!r})
        import quant_model as qmb
        qmb.SHAPES["t"] = (2048, 8192, 4, 16, 8)
        src, _ = qmb.make_model({str(tmp_path)!r}, "t")
        import orkpy
        from orkpy.formats.tiermap import TierEntry, TierMap
        shp = qmb.tensors_of("t")
        tm = TierMap({{n: TierEntry("float" if len(s) == 1 else "int4", "F16", s) for n, s in shp.items()}}, tied=True)
        def hwm():
            return [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
        base = hwm()
        if sys.argv[1] == "stream":
            orkpy.quantize_model(src, tm, output={str(tmp_path / 'out')!r}, progress=False, log=lambda s: None)
        else:
            orkpy.quantize_model(src, tm, progress=False, log=lambda s: None).save({str(tmp_path / 'out2')!r})
        print(hwm() - base, src.stat().st_size)
    """)
    res = {}
    for mode in ("stream", "memory"):
        out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True)
        res[mode] = [int(v) for v in out.stdout.split()]
    grown, size = res["stream"]
    assert size > 250e6
    assert grown < 0.35 * size, res          # about one tensor's float32 copy (2048 x 8192 x 4 = 67 MB) + overhead
    assert res["memory"][0] > 0.8 * size, res  # the path it replaces held the model's pages


def test_a_failed_background_write_fails_the_quantization_and_leaves_nothing(shared, tmp_path, monkeypatch):
    """The writer writes each linear on its own thread (add_later) while the next is quantized: an
    error there is raised in the caller (by the next add_later, or at the end), and the temporary
    folder is removed only after the write in flight has stopped."""
    from orkpy.formats.modeldir import ModelDirWriter
    real_add, calls = ModelDirWriter._add, []

    def add(self, name, pw, tier):
        calls.append(name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device (simulated)")
        return real_add(self, name, pw, tier)
    monkeypatch.setattr(ModelDirWriter, "_add", add)
    with pytest.raises(OSError, match="simulated"):
        orkpy.quantize_model(shared / STORIES, shared / Q4_0, output=tmp_path / "m", **QUIET)
    assert len(calls) == 3 and os.listdir(tmp_path) == []
    calls.clear()  # the last linear's write fails: raised at the end, before finish()
    n_linears = len(orkpy.quantize_model(shared / STORIES, shared / Q4_0, **QUIET).tensors)

    def add_last(self, name, pw, tier):
        calls.append(name)
        if len(calls) == n_linears:
            raise OSError(5, "I/O error (simulated)")
        return real_add(self, name, pw, tier)
    monkeypatch.setattr(ModelDirWriter, "_add", add_last)
    with pytest.raises(OSError, match="I/O error"):
        orkpy.quantize_model(shared / STORIES, shared / Q4_0, output=tmp_path / "m", **QUIET)
    assert len(calls) == n_linears and os.listdir(tmp_path) == []


def _held_writes(monkeypatch):
    """ModelDirWriter._add made to log the linear's name in ``calls``, set ``entered`` and wait for
    ``release`` before it writes: (calls, entered, release)."""
    import threading
    from orkpy.formats.modeldir import ModelDirWriter
    real_add, calls, entered, release = ModelDirWriter._add, [], threading.Event(), threading.Event()

    def held_add(self, name, pw, tier):
        calls.append(name)
        entered.set()
        release.wait(30)
        return real_add(self, name, pw, tier)
    monkeypatch.setattr(ModelDirWriter, "_add", held_add)
    return calls, entered, release


def test_abort_waits_for_the_write_in_flight(tmp_path, monkeypatch):
    """ModelDirWriter.abort (what an error or Ctrl-C in quantize_model reaches) removes the temporary
    folder only after the background write has stopped: a write held in flight keeps abort waiting,
    and once it is let go the folder is gone and the write's file with it."""
    import threading
    from orkpy.formats.modeldir import ModelDirWriter
    _, entered, release = _held_writes(monkeypatch)
    w = ModelDirWriter(tmp_path / "m")
    pw = orkpy.pack(orkpy.quantize(np.ones((64, 64), np.float32), "int8"))
    got = []
    w.add_later("blk.0.ffn_up.weight", pw, "int8", got.append)
    assert entered.wait(30)
    t = threading.Thread(target=w.abort)
    t.start()
    t.join(0.5)
    assert t.is_alive() and os.path.isdir(w.tmp)  # still waiting: the folder is there for the write
    release.set()
    t.join(30)
    assert not t.is_alive() and got and os.listdir(tmp_path) == []


def test_linear_into_a_scratch_buffer(shared):
    """Source.linear(scratch=): an F16 tensor is converted into the buffer (the result views it) with
    the same values; the embedding table and an F32 file's tensors ignore it."""
    from orkpy.formats.source import open_source
    src = open_source(shared / STORIES)
    name = "blk.0.ffn_up.weight"
    want = src.linear(name)
    buf = np.full(want.size, np.nan, np.float32)
    got = src.linear(name, scratch=buf.reshape(want.shape))
    assert np.shares_memory(got, buf) and np.array_equal(got, want)
    scratch = np.empty(src.shapes()["token_embd.weight"], np.float32)
    emb = src.linear("token_embd.weight", scratch=scratch)
    assert not np.shares_memory(emb, scratch) and np.array_equal(emb, src.tensor("token_embd.weight"))
    f32 = open_source(shared / STORIES.replace("F16", "F32"))
    got = f32.linear(name, scratch=buf.reshape(want.shape))
    assert not np.shares_memory(got, buf) and np.array_equal(got, f32.tensor(name))  # F32: used in place


def test_float16_weights_quantize_as_their_float32_values():
    """quantize() takes a float16 weight as stored (ork_quantize_typed converts each row on the worker
    threads): byte for byte the result of its float32 values for every kind, with an imatrix, groups,
    stochastic rounding, 1 and 2 threads, a strided view; a NaN is reported at its position."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((200, 1030)) * rng.uniform(1e-3, 2.0, (200, 1))).astype(np.float16)  # 4 chunks of rows
    w[1, :4] = np.float16(6e-8)  # float16 subnormals
    w[2] = 0
    im = rng.uniform(0.0, 2.0, 1030).astype(np.float32)
    for kind in ("nf4", "int4", "int8", "int6", "int5"):
        for kw in ({}, {"imatrix": im}, {"imatrix": im[:515], "group_size": 64}, {"sr": True, "seed": 3}):
            x = w if "group_size" not in kw else w[:, ::2]  # a strided view: copied, still float16
            for t in (1, 2):
                a = orkpy.quantize(x, kind, threads=t, **kw)
                b = orkpy.quantize(x.astype(np.float32), kind, threads=t, **kw)
                assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales), (kind, kw, t)
    bad = w.copy()
    bad[170, 513] = np.nan  # in the last chunk of rows
    bad[171, 2] = np.inf
    with pytest.raises(ValueError, match=r"non-finite value \(NaN\) at \[170, 513\]"):
        orkpy.quantize(bad, "nf4", threads=2)
    wide = rng.standard_normal((6, 8200)).astype(np.float16)  # rows past the stack scratch: heap buffers
    for kind in ("nf4", "int8"):
        a, b = orkpy.quantize(wide, kind, threads=2), orkpy.quantize(wide.astype(np.float32), kind, threads=2)
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales), kind


def test_linear_stored_views_float16_weights_only(shared, tmp_path):
    """Source.linear_stored: an F16 file's linear is a read-only float16 view of the mapped file with
    the values linear() converts; F32 and quantized files' linears are None (they go through linear())."""
    from orkpy.formats.source import open_source
    src = open_source(shared / STORIES)
    name = "blk.0.ffn_up.weight"
    v = src.linear_stored(name)
    assert v.dtype == np.float16 and not v.flags.writeable and maps_of(v)
    assert np.array_equal(v.astype(np.float32), src.linear(name))
    assert open_source(shared / STORIES.replace("F16", "F32")).linear_stored(name) is None
    assert open_source(shared / Q4_0).linear_stored(name) is None


def test_writer_queue_keeps_order_and_bounds_memory(tmp_path, monkeypatch):
    """add_later queues its jobs for one writer thread, written in order; it returns at once until the
    jobs waiting hold more than IN_FLIGHT bytes, then waits for room (a job larger than the bound
    alone still goes)."""
    import threading
    from orkpy.formats.modeldir import ModelDirWriter
    order, _, release = _held_writes(monkeypatch)
    pw = orkpy.pack(orkpy.quantize(np.ones((64, 64), np.float32), "int8"))
    size = pw.store.nbytes + pw.bscale.nbytes
    monkeypatch.setattr(ModelDirWriter, "IN_FLIGHT", 2 * size)
    w = ModelDirWriter(tmp_path / "m")
    got = []
    names = [f"blk.{i}.ffn_up.weight" for i in range(4)]
    w.add_later(names[0], pw, "int8", got.append)
    w.add_later(names[1], pw, "int8", got.append)  # two fit: both return at once
    t = threading.Thread(target=w.add_later, args=(names[2], pw, "int8", got.append))
    t.start()
    t.join(0.5)
    assert t.is_alive() and not got  # the third waits for room
    release.set()
    t.join(30)
    assert not t.is_alive()
    monkeypatch.setattr(ModelDirWriter, "IN_FLIGHT", 1)
    w.add_later(names[3], pw, "int8", got.append)  # larger than the bound: goes alone
    w.wait()
    assert order == names and len(got) == 4
    assert sorted(os.listdir(w.tmp)) == sorted(n + ".o8n1" for n in names)
    w.abort()


def test_abort_drops_the_queued_writes(tmp_path, monkeypatch):
    """abort waits for the write in flight and drops the jobs queued behind it."""
    import threading
    from orkpy.formats.modeldir import ModelDirWriter
    calls, entered, release = _held_writes(monkeypatch)
    w = ModelDirWriter(tmp_path / "m")
    pw = orkpy.pack(orkpy.quantize(np.ones((64, 64), np.float32), "nf4"))
    for i in range(3):
        w.add_later(f"blk.{i}.ffn_up.weight", pw, "int4", lambda m: None)
    assert entered.wait(30)
    t = threading.Thread(target=w.abort)
    t.start()
    t.join(0.5)
    assert t.is_alive()
    release.set()
    t.join(30)
    assert not t.is_alive() and calls == ["blk.0.ffn_up.weight"] and os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="finished or aborted"):
        w.add_later("blk.9.ffn_up.weight", pw, "int4", lambda m: None)


def test_a_failed_write_drops_the_queued_jobs_and_stays_failed(tmp_path, monkeypatch):
    """A job's error is raised once by the next call; the jobs queued behind it are never written, and
    every later add_later / wait refuses (the directory can only be aborted)."""
    from orkpy.formats.modeldir import ModelDirWriter
    calls, _, release = _held_writes(monkeypatch)
    real_held = ModelDirWriter._add

    def add(self, name, pw, tier):
        if name.startswith("blk.1."):
            calls.append(name)
            release.wait(30)
            raise OSError(28, "No space left on device (simulated)")
        return real_held(self, name, pw, tier)
    monkeypatch.setattr(ModelDirWriter, "_add", add)
    w = ModelDirWriter(tmp_path / "m")
    pw = orkpy.pack(orkpy.quantize(np.ones((64, 64), np.float32), "int8"))
    names = [f"blk.{i}.ffn_up.weight" for i in range(3)]
    for n in names:
        w.add_later(n, pw, "int8", lambda m: None)
    release.set()
    with pytest.raises(OSError, match="simulated"):
        w.wait()
    assert calls == names[:2]  # blk.2 was dropped
    with pytest.raises(ValueError, match="earlier write"):
        w.add_later("blk.3.ffn_up.weight", pw, "int8", lambda m: None)
    with pytest.raises(ValueError, match="earlier write"):
        w.wait()
    assert calls == names[:2]
    w.abort()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind,group", [("nf4", 0), ("int4", 32), ("int8", 0), ("int8", 64), ("int6", 0), ("int5", 32)])
def test_a_saved_weight_mapped_without_a_reload(tmp_path, kind, group):
    """The writer maps each file it has just written from the packed weight (packed._map_saved) instead
    of loading it: the same store, scales, kind and group as load_packed gives, the store a view of the
    file; int6 / int5 (5 / 6 bits a code in the file, int8 tiles in memory) hold nothing in memory but
    their scales until the store is first read, then the int8 tiles load_packed gives; a file that is not
    what was written is refused."""
    from orkpy.kernels.packed import _map_saved, load_packed, save_packed_sha256
    w = np.random.default_rng(5).standard_normal((70, 200)).astype(np.float32)
    pw = orkpy.pack(orkpy.quantize(w, kind, group_size=group or None))
    fp = tmp_path / f"w.{kind}"
    save_packed_sha256(pw, fp, durable=False, direct=True)
    got, want = _map_saved(pw, fp), load_packed(fp)
    views = got._file_views()  # what it holds before any use: every array a view of the file, or a scale
    assert sum(v.nbytes for v in views if not maps_of(v)) <= got.bscale.nbytes  # at most its scales in memory
    assert (got.kind, got.shape, got.group) == (want.kind, want.shape, want.group)
    assert np.array_equal(got.store, want.store) and np.array_equal(got.bscale, want.bscale)
    assert got.bscale.dtype == np.float32 and not got.store.flags.writeable
    assert bool(maps_of(got.store)) == (kind not in ("int6", "int5"))
    x = np.random.default_rng(6).standard_normal((3, 200)).astype(np.float32)
    assert np.array_equal(got.matmul(x), pw.matmul(x))
    if kind in ("nf4", "int8"):
        with open(fp, "ab") as f:
            f.write(b"x")
        with pytest.raises(orkpy.FormatError, match="were written"):
            _map_saved(pw, fp)
