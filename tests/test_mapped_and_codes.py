"""Issue 13, items 1, 2 and 7 (docs/security.md).

1. A mapped file shrunk while open: every orkpy reader that keeps (or reads
   through) a mapping raises orkpy.FormatError naming the file, in a child
   process that must exit cleanly, never by SIGBUS (signal 7).
2. int8 code -128: refused where a weight store enters (PackedWeight, the
   forward model), and every kernel door gives the exact integer on every ISA
   (the AVX2 sign trick used to return -1572864 for +1572864).
7. Packed scales: non-finite, negative and overflowing scales refused at load
   and in the constructor.
"""
import os
import signal
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import orkpy
from orkpy import _core
from orkpy.kernels.packed import PackedWeight

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLT_MAX = float(np.finfo(np.float32).max)

# ------------------------------------------------------------ child runs --

CHILD_PRELUDE = """
import os, sys
import numpy as np
import orkpy
def expect_format_error(what, fn, path):
    try:
        fn()
    except orkpy.FormatError as e:
        msg = str(e)
        assert path in msg, msg
        print(f"{what}: FormatError: {msg}", flush=True)
        return msg
    print(f"{what}: NO ERROR", flush=True)
    sys.exit(5)
"""


def run_child(body, *args, timeout=300):
    """Run PRELUDE + body in a fresh interpreter; return (returncode, stdout, stderr)."""
    code = CHILD_PRELUDE + textwrap.dedent(body)
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def assert_clean(rc, out, err):
    assert rc != -signal.SIGBUS, f"killed by SIGBUS\n{out}\n{err}"
    assert rc == 0, f"rc={rc}\n{out}\n{err}"
    assert "NO ERROR" not in out, out


def packed_file(tmp_path, kind="int8", N=256, K=4096, name="w.o8n1"):
    rng = np.random.default_rng(0)
    pw = orkpy.pack(orkpy.quantize(rng.standard_normal((N, K), np.float32), kind))
    p = tmp_path / name
    orkpy.save_packed(pw, p)
    return p


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_load_packed_shrunk_while_mapped_raises(tmp_path, kind):
    p = packed_file(tmp_path, kind)
    rc, out, err = run_child("""
        p = sys.argv[1]
        pw = orkpy.load_packed(p, mmap=True)
        x = np.random.default_rng(1).standard_normal((3, pw.K)).astype(np.float32)
        xq = np.ones((1, pw.K), np.int8)
        y0 = pw.matmul(x)
        os.truncate(p, 8192)                     # another process would do the same
        m = expect_format_error("matmul", lambda: pw.matmul(x), p)
        assert "changed size while mapped: was" in m and "now 8192" in m, m
        expect_format_error("matmul_int", lambda: pw.matmul_int(xq), p)
        expect_format_error("codes", pw.codes, p)
        expect_format_error("dequantize", pw.dequantize, p)
        expect_format_error("save", lambda: orkpy.save_packed(pw, p + ".copy"), p)
        assert not os.path.exists(p + ".copy")
        expect_format_error("x @ pw.T", lambda: x @ pw.T, p)
    """, p)
    assert_clean(rc, out, err)
    assert out.count("FormatError") == 6


def test_load_packed_copy_is_immune(tmp_path):
    p = packed_file(tmp_path)
    rc, out, err = run_child("""
        p = sys.argv[1]
        pw = orkpy.load_packed(p, mmap=False)
        x = np.random.default_rng(1).standard_normal((3, pw.K)).astype(np.float32)
        y0 = pw.matmul(x)
        os.truncate(p, 0)
        assert np.array_equal(pw.matmul(x), y0)
        print("copy unaffected")
    """, p)
    assert rc == 0 and "copy unaffected" in out, (rc, out, err)


def test_raw_read_past_new_end_is_guarded_not_fatal(tmp_path):
    """The race: the file shrinks after the entry check, during the read. A raw
    core call on the mapped store (no entry check) reads past the new end: the
    guard answers with zero pages instead of SIGBUS, flags the mapping, and the
    weight's methods raise from then on."""
    p = packed_file(tmp_path)
    rc, out, err = run_child("""
        p = sys.argv[1]
        pw = orkpy.load_packed(p, mmap=True)
        size = os.path.getsize(p)
        x = np.random.default_rng(1).standard_normal((2, pw.K)).astype(np.float32)
        os.truncate(p, 4096)
        y = orkpy._core.matmul(pw.store, pw.kind, pw.N, pw.K, np.ones(pw.N, np.float32), x)
        from orkpy._mapped import maps_of
        (mf,) = maps_of(pw.store)
        assert mf.faulted and mf.size == size
        assert np.all(y[:, -32:] == 0), "lost pages read as zeros"
        os.truncate(p, mf.size)                  # even grown back to its size, the mapping is spoilt
        m = expect_format_error("matmul after fault", lambda: pw.matmul(x), p)
        assert "shrank while mapped" in m, m
        print(orkpy._core.mapguard_state())
    """, p)
    assert_clean(rc, out, err)
    assert "'installed': True" in out


def test_race_truncation_during_matmul_loop(tmp_path):
    """A thread multiplies in a loop while the main thread truncates: the loop ends
    with FormatError, never a signal, whichever read the truncation lands in."""
    p = packed_file(tmp_path, N=1024, K=8192)  # 8 MiB: most truncations land inside a read
    rc, out, err = run_child("""
        import threading, time
        p = sys.argv[1]
        for rnd in range(3):
            pw = orkpy.load_packed(p, mmap=True)
            x = np.random.default_rng(rnd).standard_normal((4, pw.K)).astype(np.float32)
            started, result = threading.Event(), []
            def loop():
                try:
                    while True:
                        pw.matmul(x, threads=2)
                        started.set()
                except orkpy.FormatError as e:
                    result.append(str(e))
            t = threading.Thread(target=loop)
            t.start()
            started.wait(60)
            time.sleep(0.002 * rnd)
            os.truncate(p, 4096 * (1 + rnd))
            t.join(120)
            assert not t.is_alive() and result and p in result[0], result
            print("round", rnd, "FormatError:", result[0], flush=True)
            orkpy.save_packed(orkpy.load_packed(sys.argv[2], mmap=False), p)  # a fresh file for the next round
    """, p, packed_file(tmp_path, N=1024, K=8192, name="orig.o8n1"))
    assert_clean(rc, out, err)
    assert out.count("FormatError") == 3


def _small_gguf(path):
    from orkpy.formats.gguf_write import write_gguf
    rng = np.random.default_rng(0)
    write_gguf(path, [("general.architecture", "STRING", "llama")],
               [("a.weight", rng.standard_normal((64, 256)).astype(np.float32)),
                ("b.weight", rng.standard_normal((256, 256)).astype(np.float16))])


def test_gguf_shrunk_while_open_raises(tmp_path):
    p = tmp_path / "m.gguf"
    _small_gguf(p)
    rc, out, err = run_child("""
        p = sys.argv[1]
        g = orkpy.GGUFFile(p)
        a0 = g.tensor("a.weight")
        os.truncate(p, 4096)
        expect_format_error("tensor", lambda: g.tensor("b.weight"), p)
        expect_format_error("raw", lambda: g.raw("b.weight"), p)
        expect_format_error("check", g.check, p)
    """, p)
    assert_clean(rc, out, err)
    assert out.count("FormatError") == 3


def test_views_of_a_shrunk_file_read_zeros_and_orkpy_readers_raise(tmp_path):
    """A view handed out before the truncation (GGUFFile.raw of an F32 tensor, what
    load_model uses in place) reads zeros past the new end instead of killing the
    process; orkpy's readers of such a view (quantize, the forward model) raise."""
    p = tmp_path / "m.gguf"
    _small_gguf(p)
    rc, out, err = run_child("""
        p = sys.argv[1]
        g = orkpy.GGUFFile(p)
        t = g.tensor_info("a.weight")
        a = g.raw("a.weight").view(np.float32).reshape(t.shape)
        assert np.abs(a).sum() > 0
        os.truncate(p, 0)
        assert np.abs(a).sum() == 0             # the user's own read: zeros, no signal
        expect_format_error("quantize(view)", lambda: orkpy.quantize(a, "nf4"), p)
    """, p)
    assert_clean(rc, out, err)


def test_safetensors_shrunk_while_mapped(tmp_path):
    from safetensors.numpy import save_file
    p = tmp_path / "model.safetensors"
    rng = np.random.default_rng(0)
    save_file({"w": rng.standard_normal((256, 1024)).astype(np.float32),
               "b": (rng.random(40000) < 0.5)}, str(p))
    rc, out, err = run_child("""
        p = sys.argv[1]
        m = orkpy.load_safetensors(p)
        w = m["w"]
        os.truncate(p, 4096)
        s = float(np.abs(w).sum())              # reads zeros past the end, no signal
        expect_format_error("check", m.check, p)
        expect_format_error("quantize", lambda: orkpy.quantize(w, "int8"), p)
    """, p)
    assert_clean(rc, out, err)
    assert out.count("FormatError") == 2


def test_imatrix_dat_truncated_during_parse(tmp_path):
    """The .dat reader maps the file only while parsing; a truncation in the middle
    of the parse (simulated by truncating just before the parser reads) raises."""
    p = tmp_path / "im.dat"
    rc, out, err = run_child("""
        import orkpy.quantization.imatrix as I
        p = sys.argv[1]
        with open(p, "wb") as f:                  # a legacy .dat: 4 entries of 4096 values
            import struct
            f.write(struct.pack("<i", 4))
            for i in range(4):
                name = f"blk.{i}.ffn_up.weight".encode()
                f.write(struct.pack("<i", len(name)) + name + struct.pack("<ii", 1, 4096))
                f.write(np.full(4096, 0.5, "<f4").tobytes())
            f.write(struct.pack("<ii", 3, 1) + b"x")
        assert len(orkpy.Imatrix.load(p)) == 4
        orig = I._load_dat
        def truncate_then_parse(cls, path, buf, chunk_size):
            os.truncate(path, 4096)
            return orig(cls, path, buf, chunk_size)
        I._load_dat = truncate_then_parse
        expect_format_error("Imatrix.load", lambda: orkpy.Imatrix.load(p), p)
    """, p)
    assert_clean(rc, out, err)


def test_quantized_model_dir_shrunk_packed_file(tmp_path):
    """load_model(directory) maps every packed linear; forward() checks them all."""
    from orkpy.evaluation.synthetic import make_synthetic
    make_synthetic(tmp_path / "src", n_layer=1, n_embd=64, n_ff=160, n_head=2, n_head_kv=1)
    rc, out, err = run_child("""
        import glob
        from orkpy.quantization.calibrate import quantize_model
        src = sys.argv[1]
        qm = quantize_model(src + "/synthetic-F16.gguf", src + "/synthetic-alloc.map", progress=False,
                            log=lambda m: None)
        d = qm.save(src + "/q")
        m = orkpy.load_model(d)
        toks = np.arange(1, 9)
        m.forward(toks)
        victim = sorted(glob.glob(d + "/*.o4n1"))[0]
        os.truncate(victim, 64)
        expect_format_error("forward", lambda: m.forward(toks), victim)
    """, tmp_path / "src")
    assert_clean(rc, out, err)


def test_foreign_sigbus_still_kills(tmp_path):
    """The guard answers only faults in orkpy's own mappings: a SIGBUS in anyone
    else's mapping still takes the default action (signal 7), it is not swallowed."""
    p = tmp_path / "f.bin"
    p.write_bytes(b"\1" * 65536)
    rc, out, err = run_child("""
        import mmap
        p = sys.argv[1]
        keep = orkpy._core.MappedFile(p)            # installs the guard
        f = open(p, "rb")
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        os.truncate(p, 0)
        print("reading", flush=True)
        print(m[40000])
    """, p)
    assert rc == -signal.SIGBUS, (rc, out, err)
    assert "reading" in out


def test_mappedfile_basics(tmp_path):
    p = tmp_path / "b.bin"
    p.write_bytes(bytes(range(256)) * 20)
    base = _core.mapguard_state()["mappings"]
    mf = _core.MappedFile(p)
    assert len(mf) == 5120 and mf.size == 5120 and mf[3] == 3 and mf[-1] == 255 and mf[2:5] == b"\2\3\4"
    assert mf[0:10:3] == bytes([0, 3, 6, 9]) and mf.path == str(p)
    a = np.frombuffer(memoryview(mf), np.uint8)
    with pytest.raises(BufferError):
        mf.close()
    with pytest.raises(ValueError):
        a[0] = 1
    mf.check()
    assert _core.mapguard_state()["mappings"] == base + 1
    del a
    mf.close()
    assert mf.closed and _core.mapguard_state()["mappings"] == base
    with pytest.raises(ValueError, match="closed"):
        mf.check()
    with pytest.raises(FileNotFoundError):
        _core.MappedFile(tmp_path / "missing")
    with pytest.raises(IsADirectoryError):
        _core.MappedFile(tmp_path)
    empty = tmp_path / "e"
    empty.write_bytes(b"")
    assert len(_core.MappedFile(empty)) == 0


def test_modified_in_place_is_detected(tmp_path):
    p = packed_file(tmp_path)
    pw = orkpy.load_packed(p)
    x = np.ones((1, pw.K), np.float32)
    pw.matmul(x)
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(orkpy.FormatError, match="modified while mapped"):
        pw.matmul(x)


def test_replaced_by_rename_keeps_working(tmp_path):
    """save_packed replaces a file by rename: a weight mapped from the old file keeps
    its own (unlinked) inode and stays valid."""
    p = packed_file(tmp_path)
    pw = orkpy.load_packed(p)
    x = np.random.default_rng(2).standard_normal((2, pw.K)).astype(np.float32)
    y0 = pw.matmul(x)
    orkpy.save_packed(orkpy.pack(orkpy.quantize(np.ones((pw.N, pw.K), np.float32), "int8")), p)
    assert np.array_equal(pw.matmul(x), y0)


# ------------------------------------------------------- int8 code -128 --

def int8_store(codes):
    """The pack.h tile store of any int8 codes (-128 included: written directly)."""
    N, K = codes.shape
    Np, Kp = -(-N // 32) * 32, -(-K // 32) * 32
    full = np.zeros((Np, Kp), np.int8)
    full[:N, :K] = codes
    return np.ascontiguousarray(full.reshape(Np // 32, 32, Kp // 32, 32).transpose(0, 2, 1, 3)), N, K


def with_code(store, n, k, value, K):
    """The store with W[n, k] set (tile layout of pack.h)."""
    s = store.copy()
    s[n // 32, k // 32, n % 32, k % 32] = value
    return s


def test_packedweight_refuses_minus_128():
    codes = np.random.default_rng(0).integers(-127, 128, (40, 70)).astype(np.int8)
    store, N, K = int8_store(codes)
    bscale = np.ones(N, np.float32)
    PackedWeight("int8", (N, K), store, bscale)  # valid
    with pytest.raises(ValueError, match=r"-128 at \[33, 65\]"):
        PackedWeight("int8", (N, K), with_code(store, 33, 65, -128, K), bscale)
    pad = store.copy()
    pad[1, 2, 20, 31] = -128  # row 52 >= N: padding
    with pytest.raises(ValueError, match="padding"):
        PackedWeight("int8", (N, K), pad, bscale)
    with pytest.raises(TypeError):
        PackedWeight("int8", (N, K), store.view(np.uint8), bscale)
    with pytest.raises(ValueError, match="shape"):
        PackedWeight("int8", (N + 40, K), store, bscale)


def exact(codes, xq):
    return xq.astype(np.int64) @ codes.astype(np.int64).T


@pytest.mark.parametrize("M", [1, 2, 5])
def test_core_doors_exact_for_weight_minus_128_on_every_isa(M, isa):
    """_core.matmul_int / _core.matmul take a raw store on every call (no per-call
    scan): the kernels give the exact answer for -128 on every ISA."""
    rng = np.random.default_rng(M)
    N, K = 64, 96
    codes = rng.integers(-127, 128, (N, K)).astype(np.int8)
    codes[3, :] = -128
    codes[:, 5] = -128
    store, _, _ = int8_store(codes)
    xq = rng.integers(-127, 128, (M, K)).astype(np.int8)
    xq[0, :] = -127
    x = rng.standard_normal((M, K)).astype(np.float32)
    x[0, :] = -1.0
    ref = exact(codes, xq)
    assert ref[0, 3] == 127 * 128 * K
    with orkpy.use_isa("scalar"):
        y_ref = _core.matmul(store, "int8", N, K, np.ones(N, np.float32), x)
    assert y_ref[0, 3] == pytest.approx(128 * K, rel=1e-6)
    with orkpy.use_isa(isa):
        got = _core.matmul_int(store, "int8", N, K, xq)
        y = _core.matmul(store, "int8", N, K, np.ones(N, np.float32), x)
    assert np.array_equal(got, ref)
    assert np.array_equal(y, y_ref)


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_activation_minus_128_exact_on_every_isa(kind, isa):
    """int8 activations of -128 (matmul_int) with weights of -128 too: the case the
    AVX2 sign trick cannot do, taken by the exact scalar kernels on every ISA."""
    rng = np.random.default_rng(7)
    N, K = 64, 4096
    if kind == "int8":
        W = np.full((N, K), -128, np.int8)
        store, _, _ = int8_store(W)
    else:
        pw = orkpy.pack(orkpy.quantize(rng.standard_normal((N, K)).astype(np.float32), kind))
        store, W = pw.store, pw.int8_weight()
    xq = rng.integers(-128, 128, (3, K)).astype(np.int8)
    xq[0] = -128
    ref = exact(W, xq)
    if kind == "int8":
        assert ref[0, 0] == 128 * 128 * K == 67108864
    with orkpy.use_isa(isa):
        for threads in (1, 2):
            got = _core.matmul_int(store, kind, N, K, xq, threads)
            assert np.array_equal(got, ref), threads


def test_activation_minus_128_needs_k_below_max():
    K = 131072
    store = np.ones((1, K // 32, 32, 32), np.int8)
    xq = np.ones((1, K), np.int8)
    assert _core.matmul_int(store, "int8", 1, K, xq)[0, 0] == K
    xq[0, 7] = -128
    with pytest.raises(ValueError, match="K < 131072"):
        _core.matmul_int(store, "int8", 1, K, xq)


def test_packed_weight_matmul_int_minus_128_same_on_every_isa(isa):
    codes = np.random.default_rng(3).integers(-127, 128, (40, 300)).astype(np.int8)
    pw = orkpy.pack(orkpy.quantize(codes.astype(np.float32), "int8"))
    xq = np.full((2, 300), -128, np.int8)
    with orkpy.use_isa(isa):
        got = pw.matmul_int(xq)
    assert np.array_equal(got, exact(pw.int8_weight(), xq))


def _synthetic_parts(tmp_path):
    from orkpy.runtime.model import _forward_model, linear_names
    from orkpy.formats.source import GGUFSource
    from orkpy.evaluation.synthetic import make_synthetic
    make_synthetic(tmp_path, n_layer=1, n_embd=64, n_ff=160, n_head=2, n_head_kv=1)
    src = GGUFSource(tmp_path / "synthetic-F16.gguf")

    def assemble(g, hp, spec_of):
        return _forward_model(hp, src.tensor, {n: spec_of(n) for n in linear_names(hp)})
    return src.g, src.hp, assemble


def test_forward_model_refuses_minus_128_and_bad_scales(tmp_path):
    from orkpy.runtime.model import LinearSpec
    g, hp, assemble = _synthetic_parts(tmp_path)

    def spec_with(store_edit=None, scale=None):
        def spec_of(name):
            pw = orkpy.pack(orkpy.quantize(g.tensor("token_embd.weight" if name == "output.weight" else name), "int8"))
            store, bscale = pw.store, pw.bscale
            if name == "blk.0.ffn_up.weight":
                if store_edit:
                    store = with_code(store, 5, 9, -128, pw.K)
                if scale is not None:
                    bscale = bscale.copy()
                    bscale[2] = scale
            return LinearSpec(name, "packed", pw.N, pw.K, kind=pw.kind, store=store, bscale=bscale)
        return spec_of

    assemble(g, hp, spec_with())
    with pytest.raises(ValueError, match=r"-128 at \[5, 9\]"):
        assemble(g, hp, spec_with(store_edit=True))
    for bad, what in ((3e38, "exceeds"), (float("inf"), "finite"), (-1.0, "finite non-negative")):
        with pytest.raises(ValueError, match=what):
            assemble(g, hp, spec_with(scale=bad))


def test_npu_is_exact_for_the_full_int8_range():
    """The NPU path is a general int8 matmul (plan.h): -128 in both operands is exact there."""
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (4, 64)).astype(np.int8)
    b = rng.integers(-128, 128, (32, 64)).astype(np.int8)
    a[0], b[0] = -128, -128
    got = orkpy.runtime.npu.matmul(a, b, backend="emu")
    assert np.array_equal(got, exact(b, a)) and got[0, 0] == 128 * 128 * 64


# ------------------------------------------------------------- scales ---

def o4n1_with_scale(tmp_path, value, kind="nf4", K=4096):
    pw = orkpy.pack(orkpy.quantize(np.random.default_rng(0).standard_normal((32, K)).astype(np.float32), kind))
    p = tmp_path / "s.o4n1"
    orkpy.save_packed(pw, p)
    b = bytearray(p.read_bytes())
    b[64 + 4 * 7: 64 + 4 * 8] = struct.pack("<f", value)
    p.write_bytes(bytes(b))
    return p


@pytest.mark.parametrize("mm", [True, False])
def test_load_refuses_overflowing_scale(tmp_path, mm):
    with pytest.raises(orkpy.FormatError, match=r"scale\[7\] = 3e\+38 exceeds .* K = 4096"):
        orkpy.load_packed(o4n1_with_scale(tmp_path, 3e38), mmap=mm)
    cap = FLT_MAX / (127 * 127 * 4096)
    ok = np.float32(cap)
    if float(ok) > cap:
        ok = np.nextafter(ok, np.float32(0))
    pw = orkpy.load_packed(o4n1_with_scale(tmp_path, float(ok)), mmap=mm)
    y = pw.matmul(np.full((1, 4096), -1.0, np.float32))
    assert np.all(np.isfinite(y))
    above = np.nextafter(ok, np.float32(np.inf))
    with pytest.raises(orkpy.FormatError, match="exceeds"):
        orkpy.load_packed(o4n1_with_scale(tmp_path, float(above)), mmap=mm)
    with pytest.raises(orkpy.FormatError, match="not a finite"):
        orkpy.load_packed(o4n1_with_scale(tmp_path, float("nan")), mmap=mm)


def test_constructor_and_pack_refuse_bad_scales():
    pw = orkpy.pack(orkpy.quantize(np.random.default_rng(0).standard_normal((40, 100)).astype(np.float32), "int4"))
    for bad, what in ((3e38, r"scale\[4\] = 3e\+38 exceeds"), (np.inf, "finite"), (np.nan, "finite"),
                      (-1.0, "non-negative"), (-0.0, "non-negative")):
        b = pw.bscale.copy()
        b[4] = bad
        with pytest.raises(ValueError, match=what):
            PackedWeight("int4", pw.shape, pw.store, b)
    with pytest.raises(TypeError):
        PackedWeight("int4", pw.shape, pw.store, pw.bscale.astype(np.float64))
    huge = np.full((4, 64), 3e38, np.float32)
    with pytest.raises(ValueError, match="exceeds"):
        orkpy.pack(orkpy.quantize(huge, "int8"))
