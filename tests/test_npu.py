"""The NPU layer end to end: planner, layouts, chained command streams, the
strict emulator, the rknpu / rocket device backends over the fake kernel, and
the forward pass through an NPU backend. No RK3588 board here: every device
path below runs against the fake kernel (tests/npu_fake/fake_kernel.c, a test-only
library that conftest.py builds and loads: the shipped extension has none)."""
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import orkpy
from orkpy.runtime import npu
from orkpy.kernels.packed import pack
from orkpy.kernels.quant import quantize
from orkpy.evaluation.testing import FAKE_DROP, FAKE_HANG

# the fake kernel drivers are a test-only library (tests/npu_fake), built and loaded by conftest.py
pytestmark = pytest.mark.usefixtures("fake_kernel")

BACKENDS = [("emu", None), ("rknpu", "rknpu"), ("rocket", "rocket")]
IDS = ["emu", "fake-rknpu", "fake-rocket"]


def ref(a, b):
    # float64 is exact here: |sum| < 2^53
    return (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.int64)


def rand(rng, *shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


@pytest.fixture(scope="module", params=BACKENDS, ids=IDS)
def dev(request):
    be, fk = request.param
    d = npu.Device(be, fake_kernel=fk)
    yield d
    d.close()


# (M, K, N, caps): the M in {1, 4, 64, 544}, K and N up to 8192, and
# multi-task chains (natural splits of M or K, and forced small tiles)
SHAPES = [
    (1, 4096, 4096, {}),
    (4, 64, 32, {}),
    (1, 8192, 8192, {}),
    (4, 8192, 8192, {}),
    (64, 8192, 1024, {}),          # 2 M tiles (44-row cap at K = 8192)
    (544, 544, 4096, {}),
    (544, 4096, 512, {}),          # 7 M tiles
    (544, 2048, 8192, {}),         # 4 M tiles, N = 8192 in one task
    (4, 10000, 96, {}),            # K > 8192: 2 K tiles summed on the host
    (3, 100, 50, {}),              # nothing aligned
    (64, 777, 333, dict(max_m=16, max_k=256, max_n=64)),  # 4 x 4 x 6 = 96 chained tasks
    (1, 8192, 8192, dict(max_n=1024)),                    # 8 chained tasks
]


@pytest.mark.parametrize("M,K,N,caps", SHAPES, ids=[f"{m}x{k}x{n}{'-caps' if c else ''}" for m, k, n, c in SHAPES])
def test_exact_int32(dev, M, K, N, caps):
    rng = np.random.default_rng(M * 7919 + K * 31 + N)
    a, b = rand(rng, M, K), rand(rng, N, K)
    w = dev.upload(b, **caps)
    c = dev.matmul(a, w)
    assert c.dtype == np.int32 and c.shape == (M, N)
    assert np.array_equal(c, ref(a, b))
    p = npu.plan(M, K, N, **caps)
    if caps or M * K > 11 * 32768 or K > 8192:
        assert p["n_tasks"] > 1


def test_extremes_and_reuse(dev):
    """-128 * -128 everywhere at K = 8192 (the int32 range the NPU must hold), and
    one uploaded weight reused for several M."""
    a = np.full((4, 8192), -128, np.int8)
    b = np.full((32, 8192), -128, np.int8)
    assert (dev.matmul(a, b) == 8192 * 16384).all()
    rng = np.random.default_rng(5)
    b = rand(rng, 96, 320)
    w = dev.upload(b)
    for M in (1, 4, 7, 64):
        a = rand(rng, M, 320)
        assert np.array_equal(dev.matmul(a, w), ref(a, b))


@pytest.mark.parametrize("kind", ["int8", "nf4", "int4"])
def test_packed_weight_matches_cpu_kernels(dev, kind):
    """A PackedWeight runs on the NPU with its int8 values (LUT-inflated for
    4-bit): the int32 accumulators equal the CPU kernels' exactly."""
    rng = np.random.default_rng(11)
    pw = pack(quantize(rng.standard_normal((200, 300)).astype(np.float32), kind))
    xq = rng.integers(-127, 128, (9, 300), dtype=np.int8)
    assert np.array_equal(dev.matmul(xq, pw), pw.matmul_int(xq))


@pytest.mark.parametrize("base", [0x1000, 0xF0000000])
def test_emu_address_bases(base):
    """Fake NPU addresses low (like rocket, from 0x1000) and near the top of
    the 32-bit space (like the vendor IOMMU)."""
    d = npu.Device("emu", emu_base=base)
    rng = np.random.default_rng(3)
    a, b = rand(rng, 64, 1000), rand(rng, 300, 1000)
    assert np.array_equal(d.matmul(a, b, max_n=64), ref(a, b))
    assert d.upload(b).npu_address >= base


def test_module_matmul_and_available():
    rng = np.random.default_rng(0)
    a, b = rand(rng, 4, 64), rand(rng, 32, 64)
    assert np.array_equal(npu.matmul(a, b), ref(a, b))
    assert "emu" in npu.available()
    why = npu.unavailable()
    for be in ("rknpu", "rocket"):  # no board here
        assert be not in npu.available() and be in why[be]


@pytest.mark.parametrize("be", ["rknpu", "rocket"])
def test_missing_device_raises(be):
    with pytest.raises(orkpy.NPUUnavailableError, match=be) as e:
        npu.Device(be)
    assert isinstance(e.value, orkpy.UnavailableError) and isinstance(e.value, orkpy.NPUError)


def test_bad_arguments():
    d = npu.Device("emu")
    with pytest.raises(ValueError, match="backend"):
        npu.Device("cuda")
    with pytest.raises(TypeError, match="int8"):
        d.matmul(np.zeros((4, 64), np.float32), np.zeros((32, 64), np.int8))
    w = d.upload(np.zeros((32, 64), np.int8))
    with pytest.raises(ValueError, match=r"\(M, 64\)"):
        d.matmul(np.zeros((4, 65), np.int8), w)
    with pytest.raises(ValueError, match="fixed when a weight is uploaded"):
        d.matmul(np.zeros((4, 64), np.int8), w, max_n=32)
    with pytest.raises(ValueError, match="another NPU device"):
        npu.Device("emu").matmul(np.zeros((4, 64), np.int8), w)
    with pytest.raises(ValueError, match="fake_kernel"):
        npu.Device("rknpu", fake_kernel="rocket")
    with pytest.raises(ValueError, match="K = "):
        npu.plan(4, 200000, 32)
    with pytest.raises(ValueError, match="empty"):
        npu.plan(0, 64, 32)
    d.close()
    with pytest.raises(ValueError, match="closed"):
        d.upload(np.zeros((32, 64), np.int8))


# ------------------------------------------------------------ planner -----
@pytest.mark.parametrize("M,K,N,caps", [(1, 8192, 8192, {}), (544, 8192, 8192, {}), (5, 20000, 100, {}),
                                        (64, 777, 333, dict(max_m=16, max_k=256, max_n=64)), (2047, 64, 32, {})])
def test_plan_covers_once_within_limits(M, K, N, caps):
    p = npu.plan(M, K, N, **caps)
    for t in p["tasks"]:
        Mp, Kt, Nt = t["Mp"], t["Kt"], t["Nt"]
        assert (Mp == 1 or Mp % 4 == 0) and Mp <= 2044 and Kt % 32 == 0 and Kt <= 8192 and Nt % 32 == 0 and Nt <= 8192
        assert Mp * Kt <= 11 * 32768
        assert t["Mt"] <= Mp and t["in_off"] % 64 == 0 and t["w_off"] % 64 == 0 and t["out_off"] % 64 == 0
    # the tasks are the product of m, k and n tiles, each combination once, and
    # the tiles of each axis partition it
    combos = [((t["m0"], t["Mt"]), (t["k0"], t["Kt"]), (t["n0"], t["Nt"])) for t in p["tasks"]]
    assert len(set(combos)) == len(combos)
    for axis, total in ((0, M), (1, p["Kp"]), (2, p["Np"])):
        tiles = sorted({c[axis] for c in combos})
        assert tiles[0][0] == 0 and sum(n for _, n in tiles) == total
        assert all(a[0] + a[1] == b[0] for a, b in zip(tiles, tiles[1:]))
    assert len(combos) == p["nm"] * p["nk"] * p["nn"]
    assert p["cmd_bytes"] == 864 * p["n_tasks"]


def test_plan_chain_tails():
    """Each task's tail links to the next task (PC_BASE_ADDRESS = its address,
    PC_REGISTER_AMOUNTS = (104 + 4 + 1) // 2 - 1 = 53), the last one ends the
    chain exactly like the single-task tail, and every body is the
    stand-alone task body of its tile."""
    caps = dict(max_m=16, max_k=256, max_n=64)
    M, K, N = 40, 600, 150
    base = dict(cmd_addr=0x100000, in_addr=0x200000, w_addr=0x400000, out_addr=0x800000)
    q = npu.plan_commands(M, K, N, *base.values(), **caps).reshape(-1, 108)
    p = npu.plan(M, K, N, **caps)
    assert q.shape[0] == p["n_tasks"] == 3 * 3 * 3
    for i, t in enumerate(p["tasks"]):
        body = npu.matmul_task(t["Mp"], t["Kt"], t["Nt"], base["in_addr"] + t["in_off"], base["w_addr"] + t["w_off"],
                               base["out_addr"] + t["out_off"])
        assert np.array_equal(q[i, :104], body[:104])
        if i + 1 < len(p["tasks"]):
            nxt = base["cmd_addr"] + p["tasks"][i + 1]["cmd_off"]
            assert q[i, 104] == (0x0101 << 48) | (nxt << 16) | 0x0010
            assert q[i, 105] == (0x0101 << 48) | (npu.pc_amount(104) << 16) | 0x0014
        else:
            assert np.array_equal(q[i, 104:], body[104:])
        assert q[i, 106] == 0x0041 << 48 and q[i, 107] == 0x0081_0000_000D_0008
    assert npu.pc_amount(104) == 53 and npu.pc_amount(108) == 55  # driver formula; 108 -> 55 as the RKNN capture


# ------------------------------------------------------------ layouts -----
@pytest.mark.parametrize("M,K,N,caps", [(1, 100, 50, {}), (13, 300, 70, dict(max_m=4, max_k=64, max_n=32)),
                                        (64, 9000, 40, {})])
def test_layout_round_trips_and_zero_padding(M, K, N, caps):
    rng = np.random.default_rng(1)
    a, b = rand(rng, M, K), rand(rng, N, K)
    a[a == 0] = 1
    b[b == 0] = 1
    ib = npu.layout("pack_input", M, K, N, a, **caps)
    wb = npu.layout("pack_weights", M, K, N, b, **caps)
    assert np.array_equal(npu.layout("unpack_input", M, K, N, ib, **caps), a)
    assert np.array_equal(npu.layout("unpack_weights", M, K, N, wb, **caps), b)
    # every padding lane and gap is zero: nonzero bytes are exactly the operands
    # (input blocks are shared by the N tiles, weight blocks by the M tiles)
    assert np.count_nonzero(ib) == M * K and np.count_nonzero(wb) == N * K


def test_feature_and_output_layouts_are_nc1hwc2():
    """Feature C2 = 16 for int8: A[m][k] at ((k // 16) * M + m) * 16 + k % 16;
    output C2 = 4 int32: C[m][n] at ((n // 4) * M + m) * 4 + n % 4 (docs/npu.md, sources)."""
    M, K, N = 8, 64, 32
    a = (np.arange(M * K) % 251 - 125).astype(np.int8).reshape(M, K)
    ib = npu.layout("pack_input", M, K, N, a)
    m, k = np.meshgrid(np.arange(M), np.arange(K), indexing="ij")
    assert np.array_equal(ib.view(np.int8)[((k // 16) * M + m) * 16 + k % 16], a)
    out = np.zeros(M * N * 4, np.uint8)
    C = np.arange(M * N, dtype=np.int32).reshape(M, N)
    m, n = np.meshgrid(np.arange(M), np.arange(N), indexing="ij")
    out.view(np.int32)[((n // 4) * M + m) * 4 + n % 4] = C
    assert np.array_equal(npu.layout("unpack_output", M, K, N, out), C)


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_weight_buffer_is_the_packed_tile_store(kind):
    """With one K tile the NPU weight buffer is the PackedWeight tile order
    (N/32, K/32, 32, 32): for int8 byte for byte the same store."""
    rng = np.random.default_rng(2)
    pw = pack(quantize(rng.standard_normal((100, 200)).astype(np.float32), kind))
    d = npu.Device("emu")
    w = d.upload(pw)
    codes = pw.matmul_int(np.eye(200, dtype=np.int8)).T.astype(np.int8)  # the int8 values, (N, K)
    buf = npu.layout("pack_weights", 1, 200, 100, codes)
    if kind == "int8":
        assert np.array_equal(buf.view(np.int8)[:pw.store.size], pw.store.reshape(-1).view(np.int8))
    a = rand(rng, 3, 200)
    assert np.array_equal(d.matmul(a, w), ref(a, codes))


# ------------------------------------------------------------ emulator ----
def _single_task(M=4, K=64, N=32):
    rng = np.random.default_rng(4)
    a, b = rand(rng, M, K), rand(rng, N, K)
    cmd_addr, in_addr, w_addr, out_addr = 0x1000, 0x2000, 0x4000, 0x8000
    q = npu.plan_commands(M, K, N, cmd_addr, in_addr, w_addr, out_addr)
    bufs = {"cmd": (cmd_addr, q.view(np.uint8).copy()),
            "in": (in_addr, npu.layout("pack_input", M, K, N, a).copy()),
            "w": (w_addr, npu.layout("pack_weights", M, K, N, b).copy()),
            "out": (out_addr, np.zeros(M * N * 4, np.uint8))}
    return a, b, q, bufs


def _run(bufs, q=None, amount=53, tasks=1):
    if q is not None:
        bufs = dict(bufs, cmd=(bufs["cmd"][0], np.asarray(q, np.uint64).view(np.uint8).copy()))
    return npu.emulate(list(bufs.values()), bufs["cmd"][0], amount, tasks), bufs


def test_emulator_runs_the_stream():
    a, b, q, bufs = _single_task()
    stats, bufs = _run(bufs)
    assert stats == {"tasks": 1, "qwords": 108, "macs": 4 * 64 * 32}
    assert np.array_equal(npu.layout("unpack_output", 4, 64, 32, bufs["out"][1]), ref(a, b))


def test_emulator_refuses_every_single_value_change():
    """Strict: adding 1 to the value of any of the 104 body qwords is refused
    (a constant the model does not know, a size inconsistent with the others,
    an unaligned or unmapped address) -- never silently reinterpreted."""
    a, b, q, bufs = _single_task()
    accepted = []
    for i in range(104):
        m = q.copy()
        m[i] = np.uint64(int(m[i]) + (1 << 16))
        try:
            _run(bufs, m)
            accepted.append(i)
        except orkpy.NPUCommandError:
            pass
    assert accepted == []


@pytest.mark.parametrize("mutate,match", [
    (lambda q: q.__setitem__(13, (0x0201 << 48) | (0xA << 16) | 0x104C), "CNA_CVT_CON0"),
    (lambda q: q.__setitem__(20, (0x0201 << 48) | 0x1234), "not modelled"),
    (lambda q: q.__setitem__(20, (0x2001 << 48) | 0x5004), "DPU_RDMA 0x5004"),
    (lambda q: q.__setitem__(20, (0x4001 << 48) | 0x6004), "not modelled"),
    (lambda q: q.__setitem__(106, 0), "without the 0x0041 marker"),
    (lambda q: q.__setitem__(107, 0x0081_0000_001D_0008), "op-enable"),
    (lambda q: q.__setitem__(105, (0x0101 << 48) | 0x0018), "PC register 0x0018"),
    (lambda q: q.__setitem__(slice(1, 2), (0x0201 << 48) | (0x120 << 16) | 0x100C), "CNA_CONV_CON1"),  # fp16 input
])
def test_emulator_refuses_unmodelled(mutate, match):
    a, b, q, bufs = _single_task()
    m = q.copy()
    mutate(m)
    with pytest.raises(orkpy.NPUCommandError, match=match):
        _run(bufs, m)


def test_emulator_refuses_fp16_task_and_broken_chains():
    a, b, q, bufs = _single_task()
    fp16 = npu.matmul_task(4, 64, 32, 0x2000, 0x4000, 0x8000, "fp16")
    with pytest.raises(orkpy.NPUCommandError, match="needs"):
        _run(bufs, fp16)
    with pytest.raises(orkpy.NPUCommandError, match="chain ends after task 1 of 2"):
        _run(bufs, q, tasks=2)
    with pytest.raises(orkpy.NPUCommandError, match="without op-enable"):
        _run(bufs, q, amount=51)  # the PC would fetch only 104 qwords
    with pytest.raises(orkpy.NPUCommandError, match="outside the mapped"):
        _run(bufs, q, amount=60)
    m = q.copy()
    m[57] = (0x1001 << 48) | (0x9000 << 16) | 0x4020  # output address off the end of every buffer
    with pytest.raises(orkpy.NPUCommandError, match="outside the mapped buffers"):
        _run(bufs, m)


# ------------------------------------------------------------ fake kernel --
@pytest.mark.parametrize("be", ["rknpu", "rocket"])
def test_fake_kernel_hang_is_a_timeout_and_recovers(be):
    d = npu.Device(be, fake_kernel=be, timeout_ms=50)
    rng = np.random.default_rng(9)
    a, b = rand(rng, 4, 64), rand(rng, 32, 64)
    w = d.upload(b)
    d.set_faults(FAKE_HANG)
    with pytest.raises(orkpy.NPUTimeoutError, match="50 ms"):
        d.matmul(a, w)
    d.set_faults(0)
    assert np.array_equal(d.matmul(a, w), ref(a, b))
    trace = d.info()["fake_kernel"]["trace"].split()
    if be == "rknpu":  # the core is reset once: right after the timed-out submit, never at open
        assert trace.count("RKNPU_ACTION") == 1
        assert trace[trace.index("RKNPU_ACTION") - 1] == "RKNPU_SUBMIT"
    else:  # the timed-out job's buffers are dropped, never reused while it may still run
        assert trace.count("GEM_CLOSE") >= 3


@pytest.mark.parametrize("be", ["rknpu", "rocket"])
def test_dropped_job_is_an_error_not_stale_output(be):
    """rocket's SUBMIT returns 0 even when a job fails (docs/npu.md, sources): the
    output buffer is filled with a value no task can produce before every
    submit, so a job that never ran is an NPUError, not the previous result."""
    d = npu.Device(be, fake_kernel=be)
    rng = np.random.default_rng(12)
    a, b = rand(rng, 4, 64), rand(rng, 32, 64)
    w = d.upload(b)
    assert np.array_equal(d.matmul(a, w), ref(a, b))
    d.set_faults(FAKE_DROP)
    with pytest.raises(orkpy.NPUError, match="did not write its output"):
        d.matmul(a, w)
    d.set_faults(0)
    assert np.array_equal(d.matmul(a, w), ref(a, b))


@pytest.mark.parametrize("be,fk", BACKENDS, ids=IDS)
def test_close_frees_weights_and_refuses_reuse(be, fk):
    d = npu.Device(be, fake_kernel=fk)
    w = d.upload(np.ones((64, 128), np.int8))
    d.upload(np.ones((32, 64), np.int8))  # dropped at once: its buffer is freed
    if fk:
        assert d.info()["fake_kernel"]["live_bos"] == 1
    d.close()
    if fk:  # closing freed the live weight's buffer too
        assert d.info()["fake_kernel"]["live_bos"] == 0 and d.info()["fake_kernel"]["mapped"] == 0
    with pytest.raises(ValueError, match="closed"):
        d.matmul(np.ones((4, 128), np.int8), w)
    with pytest.raises(RuntimeError, match="initialised once"):
        d._dev.__init__("emu")
    del w


def test_emulate_argument_checks():
    a, b, q, bufs = _single_task()
    with pytest.raises(TypeError, match="tuple"):
        npu.emulate([list(bufs["cmd"])], 0x1000, 53)
    with pytest.raises(ValueError, match="crosses the 32-bit"):
        npu.emulate([(0xFFFFFE00, np.zeros(1024, np.uint8))], 0xFFFFFE00, 53)
    with pytest.raises(TypeError, match="writable"):
        npu.emulate([(0x1000, np.zeros(8, np.int32))], 0x1000, 53)


def test_emulator_refuses_misaligned_chain_link():
    caps = dict(max_n=32)
    q = npu.plan_commands(4, 64, 64, 0x1000, 0x2000, 0x4000, 0x8000, **caps)
    rng = np.random.default_rng(4)
    a, b = rand(rng, 4, 64), rand(rng, 64, 64)
    bufs = [(0x1000, q.view(np.uint8).copy()), (0x2000, npu.layout("pack_input", 4, 64, 64, a, **caps).copy()),
            (0x4000, npu.layout("pack_weights", 4, 64, 64, b, **caps).copy()), (0x8000, np.zeros(4 * 64 * 4, np.uint8))]
    npu.emulate(bufs, 0x1000, 53, 2)
    assert np.array_equal(npu.layout("unpack_output", 4, 64, 64, bufs[3][1], **caps), ref(a, b))
    m = q.copy()
    m[104] = np.uint64(int(m[104]) + (4 << 16))  # PC_BASE_ADDRESS + 4
    bufs[0] = (0x1000, m.view(np.uint8).copy())
    with pytest.raises(orkpy.NPUCommandError, match="not 16-byte aligned"):
        npu.emulate(bufs, 0x1000, 53, 2)


@pytest.mark.parametrize("be", ["rknpu", "rocket"])
def test_fake_kernel_call_order_and_cleanup(be):
    d = npu.Device(be, fake_kernel=be)
    rng = np.random.default_rng(10)
    a, b = rand(rng, 64, 1000), rand(rng, 300, 1000)
    assert np.array_equal(d.matmul(a, b, max_n=64, max_k=256), ref(a, b))
    info = d.info()
    fk = info["fake_kernel"]
    trace = fk["trace"].split()
    assert fk["refused"] == 0 and info["node"] in ("/dev/dri/renderD128", "/dev/accel/accel0")
    submit = "RKNPU_SUBMIT" if be == "rknpu" else "ROCKET_SUBMIT"
    i = trace.index(submit)
    if be == "rknpu":
        assert trace[:3] == ["open", "DRM_IOCTL_VERSION", "RKNPU_MEM_CREATE"]  # no reset at open
        assert trace[:i].count("RKNPU_MEM_SYNC(TO_DEVICE)") >= 3 and trace[i + 1] == "RKNPU_MEM_SYNC(FROM_DEVICE)"
    else:
        assert trace[i - 1] == "ROCKET_FINI_BO" and trace[i + 1] == "ROCKET_PREP_BO"
    assert fk["tasks"] == npu.plan(64, 1000, 300, max_n=64, max_k=256)["n_tasks"]
    d.close()


# ------------------------------------------------------------ ABI ---------
def test_uapi_abi_asserts_compile_x86_and_aarch64(tmp_path):
    """The _Static_asserts on struct sizes, offsets and ioctl numbers hold on
    x86_64 and on aarch64 (cross compiler); with libdrm the numbers also equal
    drm.h's DRM_IOWR/DRM_IOW (and DRM_IOCTL_GEM_CLOSE)."""
    import shutil
    from cbuild import ROOT
    src = tmp_path / "abi.c"
    src.write_text('#include "ork/npu/uapi.h"\nint main(void) { return 0; }\n')
    for cc in ("gcc", "aarch64-linux-gnu-gcc"):
        if cc != "gcc" and shutil.which(cc) is None:
            pytest.fail("aarch64-linux-gnu-gcc missing (apt-get install gcc-aarch64-linux-gnu)")
        subprocess.run([cc, "-std=c11", "-Werror", "-I", str(ROOT / "csrc"), "-c", str(src), "-o",
                        str(tmp_path / f"{cc}.o")], check=True)
    bad = tmp_path / "bad.c"  # the asserts can fail: a struct one field short is caught
    bad.write_text('#define uint64_t uint32_t\n#include <stdint.h>\n#undef uint64_t\n'
                   '#include "ork/npu/uapi.h"\nint main(void) { return 0; }\n')
    r = subprocess.run(["gcc", "-std=c11", "-I", str(ROOT / "csrc"), "-c", str(bad), "-o", str(tmp_path / "b.o")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "static assertion failed" in r.stderr
    import os
    if os.path.exists("/usr/include/libdrm/drm.h"):
        drm = tmp_path / "drm.c"
        drm.write_text('#include "ork/npu/uapi.h"\n#include <drm.h>\n'
                       '_Static_assert(ORK_DRM_IOCTL_GEM_CLOSE == DRM_IOCTL_GEM_CLOSE, "gem close");\n'
                       '_Static_assert(ORK_RKNPU_IOCTL_SUBMIT == DRM_IOWR(DRM_COMMAND_BASE + 1, ork_rknpu_submit), "s");\n'
                       '_Static_assert(ORK_ROCKET_IOCTL_PREP_BO == DRM_IOW(DRM_COMMAND_BASE + 2, ork_rocket_prep_bo), "p");\n'
                       'int main(void) { return 0; }\n')
        subprocess.run(["gcc", "-std=c11", "-Werror", "-I", str(ROOT / "csrc"), "-I/usr/include/libdrm", "-c", str(drm),
                        "-o", str(tmp_path / "d.o")], check=True)


def test_extension_does_not_link_libdrm():
    """libdrm is dlopened by the device backends, never linked: CPU-only use
    needs neither libdrm-dev to build nor libdrm.so.2 to import."""
    import shutil
    if shutil.which("ldd") is None:
        pytest.skip("ldd not found")
    out = subprocess.run(["ldd", orkpy._core.__file__], capture_output=True, text=True, check=True).stdout
    assert "libdrm" not in out, out


def _npu_probe_in_child(env_extra):
    """(libdrm mapped after import orkpy, mapped after probing, rknpu's reason, Device("rknpu") error)"""
    import os
    import sys
    code = ("import orkpy\nfrom orkpy import npu\nmapped = lambda: str('libdrm' in open('/proc/self/maps').read())\n"
            "out = [mapped()]\nwhy = npu.unavailable()\nout += [mapped(), why.get('rknpu', '')]\n"
            "try:\n    npu.Device('rknpu')\nexcept npu.NPUUnavailableError as e:\n    out.append(str(e))\n"
            "print('|'.join(out))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env_extra},
                       check=True)
    return r.stdout.strip().split("|")


def test_libdrm_loaded_only_when_a_device_backend_is_probed():
    before, after, why, err = _npu_probe_in_child({"ORKPY_LIBDRM": ""})
    assert before == "False"  # import orkpy does not load it
    assert after == "True"  # probing rknpu / rocket does (.ci/install's libdrm-dev brings libdrm2)
    assert "libdrm" not in why and "no device" in why  # the reason is the missing device, not the library
    assert "no device" in err


def test_missing_libdrm_is_the_unavailability_reason():
    before, after, why, err = _npu_probe_in_child({"ORKPY_LIBDRM": "libdrm-orkpy-missing.so.2"})
    assert before == after == "False"
    for msg in (why, err):
        assert "unavailable: libdrm-orkpy-missing.so.2 not found (install libdrm2)" in msg, msg


# ------------------------------------------------------------ forward -----
@pytest.mark.parametrize("be,fk", BACKENDS, ids=IDS)
def test_forward_through_npu_is_bit_identical(shared, be, fk):
    from orkpy.runtime.model import load_model
    m = load_model(str(shared / "models" / "stories260K" / "stories260K-F16.gguf"),
                   weights={"default": "nf4", "blk.0.attn_v.weight": "int8", "blk.1.ffn_down.weight": "int8",
                            "output.weight": "gguf"})
    toks = (np.arange(1, 97) * 37) % 512
    cpu = m.forward(toks)
    d = npu.Device(be, fake_kernel=fk)
    assert npu.use_npu(m, d) == 35  # 5 layers x 7 linears; the float head stays on the CPU
    out = m.forward(toks)
    assert np.array_equal(out, cpu)
    assert d.info()["submits"] == 35
    assert npu.use_npu(m, d, kinds=("int8",)) == 2
    assert np.array_equal(m.forward(toks), cpu)
    npu.use_npu(m, None)
    assert np.array_equal(m.forward(toks), cpu)


@pytest.mark.parametrize("be,fk", BACKENDS, ids=IDS)
def test_w4a4_and_w4a8_linears_run_in_the_int4_mode(shared, be, fk):
    """A model's w4a4 / w4a8 linears go to the NPU in its int4 mode, resident at half a byte a weight:
    w4a4 rows as int4 rows, w4a8's int8 activations and w4a4's int8 sink row as two int4 digit rows
    each; the logits are bit-identical to the CPU path's, at prefill and at decode (one row)."""
    from orkpy.runtime.model import load_model
    m = load_model(str(shared / "models" / "stories260K" / "stories260K-F16.gguf"),
                   weights={"default": "w4a4", "blk.0.attn_v.weight": "w4a8", "blk.1.ffn_down.weight": "w4a8",
                            "blk.2.ffn_up.weight": "int8", "output.weight": "gguf"})
    assert m.linears["blk.0.attn_q.weight"].act_spec.prefix == 1  # the sink row: int8 codes to +-119
    toks = (np.arange(1, 97) * 37) % 512
    cpu = m.forward(toks)
    one = m.forward(toks[:1])
    d = npu.Device(be, fake_kernel=fk)
    assert npu.use_npu(m, d) == 35
    assert np.array_equal(m.forward(toks), cpu)
    assert np.array_equal(m.forward(toks[:1]), one)
    npu.use_npu(m, None)
    # the weights themselves: int4 layout (half the int8 upload's bytes), any int8 code up to 119
    rng = np.random.default_rng(12)
    for kind in ("w4a4", "w4a8"):
        pw = orkpy.pack(orkpy.quantize(rng.standard_normal((128, 640)).astype(np.float32), kind))
        w4, w8 = d.upload(pw), d.upload(pw, precision="int8")
        assert (w4.precision, w8.precision) == ("int4", "int8") and w4.nbytes * 2 <= w8.nbytes
        xq = rng.integers(-128, 120, (5, 640)).astype(np.int8)
        xq[1] = rng.integers(-8, 8, 640)     # a row that fits int4: one int4 row
        xq[2, :3] = (-128, 119, -8)          # the digits' edges
        want = pw.matmul_int(xq)
        np.testing.assert_array_equal(d.matmul(xq, w4), want)
        np.testing.assert_array_equal(d.matmul(xq, w8), want)
        bad = xq.copy()
        bad[3, 7] = 120
        with pytest.raises(ValueError, match=r"code 120 at \(row 3, k 7\)"):
            d.matmul(bad, w4)
        with pytest.raises(ValueError, match="int4 store"):
            d.job([w4])
    with pytest.raises(ValueError, match="int4 mode"):
        d.upload(orkpy.pack(orkpy.quantize(rng.standard_normal((64, 64)).astype(np.float32), "int8")),
                 precision="int4")
    d.close()


@pytest.mark.parametrize("be,fk", BACKENDS, ids=IDS)
def test_grouped_weights_return_per_group_partials(be, fk):
    """A weight with group-wise scales runs as one job whose K tiles are its groups: the device returns
    (G, M, N) int32 partial sums, exactly the CPU model's (pack.h "Group-wise scales"), for int8, nf4 and
    the int4 mode (w4a8's int8 rows as digit rows), K not a multiple of the group included."""
    rng = np.random.default_rng(13)
    with npu.Device(be, fake_kernel=fk) as d:
        for kind, g, K in (("int8", 128, 640), ("nf4", 64, 256), ("w4a8", 32, 200), ("w4a4", 96, 576),
                           ("int8", 4096, 1000)):
            pw = orkpy.pack(orkpy.quantize(rng.standard_normal((96, K)).astype(np.float32), kind, group_size=g))
            w = d.upload(pw)
            assert w.group == pw.group
            xq = rng.integers(-128 if kind.startswith("w4") else -127, 120, (3, K)).astype(np.int8)
            want = pw.matmul_int(xq)
            got = d.matmul(xq, w)
            assert got.shape == want.shape == ((-(-K // g), 3, 96) if g < K else (3, 96))
            np.testing.assert_array_equal(got, want, err_msg=f"{kind} g{g}")
            if w.group and not kind.startswith("w4"):
                with pytest.raises(ValueError, match="group-wise partial sums"):
                    d.job([w])


def test_cli_npu_plan(capsys):
    from orkpy.cli import main
    assert main(["npu-plan", "544", "8192", "8192", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "13 task(s) (m 13 x k 1 x n 1)" in out and "... 11 more" in out
    assert main(["npu-plan", "4", "64", "64", "--max-n", "32", "--dump"]) == 0
    out = capsys.readouterr().out
    assert out.count("OP_EN.PC_OPERATION_ENABLE") == 2 and "PC.PC_BASE_ADDRESS" in out
    assert main(["info"]) == 0
    assert "npu emu:         available" in capsys.readouterr().out


def test_fused_ffn_chain_runs_its_matmuls_on_the_npu(shared):
    """The fused SwiGLU chain's gate/up/down int8 matmuls go through the NPU
    backend too (not silently back to the CPU kernels): same logits, one
    submit per linear."""
    from orkpy.evaluation import ffn
    from orkpy.runtime.model import load_model
    m = load_model(str(shared / "models" / "stories260K" / "stories260K-F16.gguf"), weights="int8")
    toks = (np.arange(1, 129) * 53) % 512
    ffn.configure(m, ffn.prep(m, toks, n_ctx=64), "fused")
    cpu = m.forward(toks[:64])
    d = npu.Device("emu")
    assert npu.use_npu(m, d) == 36
    assert np.array_equal(m.forward(toks[:64]), cpu)
    assert d.info()["submits"] == 36


def test_cli_ppl_through_the_npu(shared, capsys):
    """`orkpy ppl --npu emu` gives exactly the CPU path's perplexity; a missing
    device backend is a clear error (exit 1, a runtime failure), not a traceback."""
    from orkpy.cli import main
    import json
    args = [str(shared / "models" / "stories260K" / "stories260K-F16.gguf"),
            str(shared / "text" / "tinystories-val-B.txt"), "--ctx", "128", "--chunks", "4", "--weights", "int8",
            "--no-progress", "--json"]
    assert main(["ppl", *args]) == 0
    cpu = json.loads(capsys.readouterr().out)
    assert main(["ppl", *args, "--npu", "emu"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["ppl"] == cpu["ppl"] and "36 packed linear" in out.err
    assert main(["ppl", *args, "--npu", "rocket"]) == 1
    assert "NPUUnavailableError" in capsys.readouterr().err


# ------------------------------------------------------------ test machinery and threads --
def test_fake_kernel_is_test_machinery_in_orkpy_testing():
    from orkpy.evaluation.testing import fake_npu_device
    rng = np.random.default_rng(5)
    a, b = rand(rng, 4, 64), rand(rng, 32, 64)
    d = fake_npu_device("rocket", faults=FAKE_DROP)
    assert d.info()["sys"] == "fake-rocket" and "fake_kernel" in d.info()
    with pytest.raises(orkpy.NPUError, match="did not write its output"):
        d.matmul(a, b)
    d.set_faults(0)
    assert np.array_equal(d.matmul(a, b), ref(a, b))
    d.close()
    with fake_npu_device("rknpu", faults=FAKE_HANG, timeout_ms=20) as d:
        with pytest.raises(orkpy.NPUTimeoutError):
            d.matmul(a, b)
    with pytest.raises(ValueError, match="'rknpu' or 'rocket'"):
        fake_npu_device("emu")
    with pytest.raises(ValueError, match="fake kernel"):  # faults exist only in the fake
        npu.Device("emu").set_faults(FAKE_HANG)


def test_shipped_extension_has_no_fake_kernel():
    """The fake kernel drivers are test machinery (tests/npu_fake): not one of their symbols or
    strings is in the extension that ships (orkpy._core), only the core's test-kernel hook."""
    import orkpy._core as core
    data = pathlib.Path(core.__file__).read_bytes()
    for needle in (b"ork_fake_kernel", b"ork_npu_fake_kernel_table", b"fake-rknpu", b"fake-rocket",
                   b"fake kernel: ", b"ROCKET_SUBMIT without jobs", b"IOVA space exhausted"):
        assert needle not in data, needle
    assert b"ork_npu_test_kernel_install" in data  # the documented hook the tests' library goes through
    nm = shutil.which("nm")
    if nm:
        syms = subprocess.run([nm, "-D", "--defined-only", core.__file__], capture_output=True, text=True).stdout
        assert "ork_npu_test_kernel_install" in syms
        assert "ork_fake_" not in syms and "ork_npu_fake_kernel_table" not in syms


def test_fake_kernel_without_the_test_library_is_a_clear_error():
    """A fresh process, no fake kernel library loaded: Device(backend, fake_kernel=backend) says
    what to do; the emu backend still has no driver to fake; plain devices are unaffected."""
    code = """if True:
        import orkpy, orkpy.runtime.npu as npu, orkpy.evaluation.testing as T
        for make in (lambda: npu.Device("rknpu", fake_kernel="rknpu"), lambda: T.fake_npu_device("rocket")):
            try:
                make()
            except orkpy.UnavailableError as e:
                assert "test machinery" in str(e) and "tests/npu_fake" in str(e) and "load_fake_kernel" in str(e), e
            else:
                raise SystemExit("no error")
        try:
            npu.Device("emu", fake_kernel="emu")
        except ValueError as e:
            assert "no kernel driver to fake" in str(e), e
        npu.Device("emu").close()
        print("ok")
    """
    env = {k: v for k, v in os.environ.items() if k != "ORKPY_FAKE_KERNEL_LIB"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_fake_kernel_table_of_another_abi_is_refused(fake_kernel):
    import ctypes
    from orkpy import _core
    bad = (ctypes.c_uint32 * 40)(99, 40 * 4)  # abi 99
    with pytest.raises(ValueError, match="ABI 99"):
        _core._npu_install_fake_kernel_for_tests(ctypes.addressof(bad))
    d = npu.Device("rknpu", fake_kernel="rknpu")  # the installed table is kept
    assert d.info()["sys"] == "fake-rknpu"
    d.close()


ST = "models/stories260K/stories260K-F32.gguf"
THREAD_BACKENDS = ["emu", "rknpu"]


def _open(be):
    from orkpy.evaluation.testing import fake_npu_device
    return npu.Device("emu") if be == "emu" else fake_npu_device(be)


@pytest.mark.parametrize("be", THREAD_BACKENDS, ids=["emu", "fake-rknpu"])
def test_device_closed_while_a_forward_runs(shared, be):
    """close() from another thread while model.forward runs its linears through the
    device: the forward raises the clean "device ... closed" error (or finishes,
    bit-identical), never crashes; later forwards raise the same, and routing back
    to the CPU gives the exact logits. A close that lands inside a forward is seen,
    not hoped for: the closing thread waits until the device has run some of the
    forward's linears (its submit counter), and the case is repeated until a forward
    that had started on the device was cut off by the close."""
    import threading
    m = orkpy.load_model(shared / ST, weights="int8")
    toks = np.random.default_rng(0).integers(3, 512, 256).astype(np.int32)
    cpu = m.forward(toks, threads=1)
    cut_off = 0
    for _ in range(20):
        d = _open(be)
        assert npu.use_npu(m, d) == 36
        out = {}

        def run():
            try:
                out["logits"] = m.forward(toks, threads=1)
            except Exception as e:  # noqa: BLE001 - the test inspects it
                out["error"] = e
        t = threading.Thread(target=run)
        t.start()
        submits = 0
        while submits == 0 and t.is_alive():
            submits = d.info()["submits"]
        d.close()
        t.join()
        if "error" in out:
            assert isinstance(out["error"], (ValueError, orkpy.NPUError)), repr(out["error"])
            assert "closed" in str(out["error"])
            cut_off += 0 < submits < 36
        else:
            assert np.array_equal(out["logits"], cpu)
        with pytest.raises(ValueError, match="closed"):
            m.forward(toks, threads=1)
        npu.use_npu(m, None)
        assert np.array_equal(m.forward(toks, threads=1), cpu)
        if cut_off:
            break
    assert cut_off, "no close landed inside a forward in 20 tries"


@pytest.mark.parametrize("be", THREAD_BACKENDS, ids=["emu", "fake-rknpu"])
def test_device_shared_by_two_forwards_at_once(shared, be):
    """One device serving two models whose forwards run in two threads at once:
    both bit-identical to the CPU. The two forwards are seen to overlap (each
    records when it started and ended; repeated until the intervals intersect)."""
    import threading
    import time
    m1, m2 = (orkpy.load_model(shared / ST, weights="int8") for _ in range(2))
    toks = np.random.default_rng(1).integers(3, 512, 256).astype(np.int32)
    cpu = m1.forward(toks, threads=1)
    with _open(be) as d:
        assert npu.use_npu(m1, d) == 36 and npu.use_npu(m2, d) == 36
        for _ in range(20):
            barrier, spans, outs = threading.Barrier(2), {}, {}

            def run(i, m):
                barrier.wait()
                t0 = time.monotonic()
                outs[i] = m.forward(toks, threads=1)
                spans[i] = (t0, time.monotonic())
            ts = [threading.Thread(target=run, args=(i, m)) for i, m in enumerate((m1, m2))]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert np.array_equal(outs[0], cpu) and np.array_equal(outs[1], cpu)
            (a0, a1), (b0, b1) = spans[0], spans[1]
            if a0 < b1 and b0 < a1:
                break
        else:
            pytest.fail("the two forwards never overlapped in 20 tries")
        assert d.info()["submits"] % 72 == 0
