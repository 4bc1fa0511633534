"""The NPU's int4 x int4 -> int16 path (csrc/ork/npu/plan.h "int4", emu.h, docs/npu.md "int4"):
the planner's limits (no K tile over 480 codes, N in 64s, CBUF in bytes), the int4 layouts
against a NumPy model of the documented formulas, the strict emulator's exactness against a
NumPy int64 dot (codes at the -8 / 7 edges included) and its int16 check, the device paths
over the fake kernels, and the one table of unverified register values (code, docs and the
emitted commands agree). The cost model and bench/npu_plan.py: tests/test_npu_cost.py."""
import pathlib
import re

import numpy as np
import pytest

import orkpy
from orkpy.evaluation.testing import FAKE_DROP
from orkpy.runtime import npu

pytestmark = pytest.mark.usefixtures("fake_kernel")

ROOT = pathlib.Path(__file__).resolve().parent.parent
BANK, FEATURE_BANKS = 32768, 11


def ref(a, b):
    return a.astype(np.int64) @ b.astype(np.int64).T


def codes(rng, *shape):
    return rng.integers(-8, 8, shape, dtype=np.int8)


def edges(rng, M, K, N):
    """Random codes with the edges: an activation row of -8 and one of 7, a weight row of -8 and one of
    7 / -7 halves (the largest products: 64, -56, 49)."""
    a, b = codes(rng, M, K), codes(rng, N, K)
    a[0] = -8
    b[0] = -8
    if M > 1:
        a[-1] = 7
    if N > 1:
        b[-1, : K // 2] = 7
        b[-1, K // 2:] = -7
    return a, b


# ---------------------------------------------------------------- planner --
@pytest.mark.parametrize("M,K,N,caps", [
    (1, 32, 64, {}), (1, 480, 64, {}), (1, 481, 100, {}), (1, 2048, 2048, {}), (1, 6144, 2048, {}),
    (37, 6144, 100, {}), (544, 2048, 6144, {}), (2044, 960, 64, {}), (4, 100000, 64, {}),
    (1, 2048, 151936, {}), (64, 1000, 1000, dict(max_k=8192, max_n=8192)),
    (9, 700, 300, dict(max_k=64, max_n=64, max_m=4)),
])
def test_plan_limits(M, K, N, caps):
    p = npu.plan(M, K, N, precision="int4", **caps)
    assert p["precision"] == "int4" and p["out_esz"] == 2
    assert p["Np"] == -(-N // 64) * 64 and p["Kp"] == -(-K // 32) * 32
    pairs, rows = [], np.zeros(-(-M // 4) * 4 if M > 1 else 1, np.int64)
    for t in p["tasks"]:
        assert 32 <= t["Kt"] <= npu.INT4_MAX_KT == 480 and t["Kt"] % 32 == 0  # never a K tile over 480
        assert t["Kt"] <= caps.get("max_k", 480)
        assert t["Nt"] % 64 == 0 and t["Nt"] <= min(8192, caps.get("max_n", 8192))
        assert t["Mp"] == 1 or t["Mp"] % 4 == 0
        assert t["Mp"] * t["Kt"] // 2 <= FEATURE_BANKS * BANK  # CBUF counted in bytes
        assert all(t[k] % 64 == 0 for k in ("in_off", "w_off", "out_off"))
        if t["m0"] == 0:
            pairs.append(((t["n0"], t["Nt"]), (t["k0"], t["Kt"])))
        if t["n0"] == 0 and t["k0"] == 0:
            rows[t["m0"]:t["m0"] + t["Mp"]] += 1
    # every (n, k) exactly once: the tiles of each axis are contiguous and every pair occurs once
    ns, ks = sorted({n for n, _ in pairs}), sorted({k for _, k in pairs})
    for tiles, total in ((ns, p["Np"]), (ks, p["Kp"])):
        assert tiles[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in zip(tiles, tiles[1:]))
        assert tiles[-1][0] + tiles[-1][1] == total
    assert len(pairs) == len(set(pairs)) == len(ns) * len(ks) and (rows == 1).all()
    # K splits into near-equal tiles: as few as 480 allows
    assert p["nk"] == -(-p["Kp"] // min(480, caps.get("max_k", 480) // 32 * 32))


def test_plan_tiles_and_bytes():
    """Qwen3-1.7B's ffn_down at decode: K 6144 in 13 tiles of 15 / 14 blocks; half-byte operands
    and an int16 block per K tile; twice the rows of int8 fit the feature banks at the same Kt."""
    p = npu.plan(1, 6144, 2048, precision="int4")
    assert p["nk"] == 13 and p["nn"] == 1 and p["n_tasks"] == 13
    assert sorted({t["Kt"] for t in p["tasks"]}) == [448, 480]
    assert p["w_bytes"] == 2048 * 6144 // 2
    assert p["out_bytes"] == 13 * 2048 * 2
    i8 = npu.plan(2044, 480, 64)["nm"]
    i4 = npu.plan(2044, 480, 64, precision="int4")["nm"]
    assert (i8, i4) == (3, 2)  # 11 banks hold 748 rows of 480 int8 codes, 1500 of int4
    assert npu.plan(1, 8192, 64)["nk"] == 1 and npu.plan(1, 8192, 64, precision="int4")["nk"] == 18
    with pytest.raises(ValueError, match="precision"):
        npu.plan(1, 64, 64, precision="int2")
    with pytest.raises(ValueError, match="N 64"):
        npu.plan(1, 64, 64, precision="int4", max_n=32)


# ---------------------------------------------------------------- layouts --
def np_pack_input(a, Mp, k0, Kt):
    """The documented int4 feature block: (Kt/32, Mp, 32) codes, two per byte, even k low."""
    M = a.shape[0]
    blk = np.zeros((Kt // 32, Mp, 32), np.int64)
    sl = a[:, k0:k0 + Kt].astype(np.int64)
    full = np.zeros((M, Kt), np.int64)
    full[:, :sl.shape[1]] = sl
    blk[:, :M, :] = full.reshape(M, Kt // 32, 32).transpose(1, 0, 2)
    nib = blk.reshape(-1) & 15
    return (nib[0::2] | nib[1::2] << 4).astype(np.uint8)


def np_pack_weights(b, n0, Nt, k0, Kt):
    """The documented int4 weight block: (Nt/64, Kt/32, 64, 32) codes, two per byte, even k low."""
    full = np.zeros((Nt, Kt), np.int64)
    sl = b[n0:n0 + Nt, k0:k0 + Kt].astype(np.int64)
    full[:sl.shape[0], :sl.shape[1]] = sl
    blk = full.reshape(Nt // 64, 64, Kt // 32, 32).transpose(0, 2, 1, 3).reshape(-1) & 15
    return (blk[0::2] | blk[1::2] << 4).astype(np.uint8)


@pytest.mark.parametrize("M,K,N,caps", [(4, 64, 64, {}), (5, 1000, 200, {}), (1, 33, 65, {}),
                                        (37, 481, 130, dict(max_k=96, max_n=64, max_m=8))])
def test_layouts_match_the_documented_formulas_and_round_trip(M, K, N, caps):
    rng = np.random.default_rng(M * K + N)
    a, b = edges(rng, M, K, N)
    p = npu.plan(M, K, N, precision="int4", **caps)
    pa = npu.layout("pack_input", M, K, N, a, precision="int4", **caps)
    pb = npu.layout("pack_weights", M, K, N, b, precision="int4", **caps)
    assert pa.nbytes == p["in_bytes"] and pb.nbytes == p["w_bytes"]
    want_a, want_b = np.zeros_like(pa), np.zeros_like(pb)
    for t in p["tasks"]:
        if t["n0"] == 0:
            blk = np_pack_input(a[t["m0"]:t["m0"] + t["Mt"]], t["Mp"], t["k0"], t["Kt"])
            want_a[t["in_off"]:t["in_off"] + blk.size] = blk
        if t["m0"] == 0:
            blk = np_pack_weights(b, t["n0"], t["Nt"], t["k0"], t["Kt"])
            want_b[t["w_off"]:t["w_off"] + blk.size] = blk
    assert np.array_equal(pa, want_a) and np.array_equal(pb, want_b)  # padding lanes and gaps zero
    assert np.array_equal(npu.layout("unpack_input", M, K, N, pa, precision="int4", **caps), a)
    assert np.array_equal(npu.layout("unpack_weights", M, K, N, pb, precision="int4", **caps), b)


def test_output_blocks_are_int16_and_summed_in_int32():
    """Each task's output block is (Nt/8, Mp, 8) int16; unpack_output widens and sums the K tiles in int32
    (the values here would overflow an int16 sum: 5 tiles of 30000)."""
    M, K, N = 3, 2048, 72
    p = npu.plan(M, K, N, precision="int4")
    assert p["nk"] == 5
    out = np.zeros(p["out_bytes"], np.uint8)
    want = np.zeros((M, N), np.int64)
    rng = np.random.default_rng(1)
    for t in p["tasks"]:
        c = rng.integers(-26880, 30721, (t["Mp"], t["Nt"]))
        c[:, 0] = 30000
        blk = c.reshape(t["Mp"], t["Nt"] // 8, 8).transpose(1, 0, 2).astype("<i2").reshape(-1).view(np.uint8)
        out[t["out_off"]:t["out_off"] + blk.size] = blk
        want += c[:M, :N]  # one N tile
    got = npu.layout("unpack_output", M, K, N, out, precision="int4")
    assert got.dtype == np.int32 and np.array_equal(got, want) and got[0, 0] == 150000


@pytest.mark.parametrize("op,bad", [("pack_input", 8), ("pack_input", -9), ("pack_weights", 127),
                                    ("pack_weights", -128)])
def test_packers_refuse_codes_outside_int4(op, bad):
    a, b = np.zeros((4, 64), np.int8), np.zeros((64, 64), np.int8)
    (a if op == "pack_input" else b)[2, 33] = bad
    with pytest.raises(ValueError, match=rf"int4 code {bad} at \((m|n) 2, k 33\)"):
        npu.layout(op, 4, 64, 64, a if op == "pack_input" else b, precision="int4")
    with pytest.raises(ValueError, match="outside"):
        npu.matmul_w4a4(a if op == "pack_input" else np.zeros((4, 64), np.int8), b)


# --------------------------------------------------------------- emulator --
@pytest.mark.parametrize("M", [1, 4, 37])
@pytest.mark.parametrize("K", [32, 480, 481, 2048, 6144])
@pytest.mark.parametrize("N", [64, 100, 2048])
def test_emulator_is_exact(M, K, N):
    rng = np.random.default_rng(M * 7 + K * 13 + N)
    a, b = edges(rng, M, K, N)
    got = npu.matmul_w4a4(a, b)
    assert got.dtype == np.int32 and np.array_equal(got, ref(a, b))
    assert got[0, 0] == 64 * K  # -8 x -8 over all of K: past int16 from K = 512, exact through int32


def test_emulator_forced_small_tiles_and_extremes():
    rng = np.random.default_rng(3)
    a, b = edges(rng, 9, 700, 300)
    assert np.array_equal(npu.matmul_w4a4(a, b, max_k=64, max_n=64, max_m=4), ref(a, b))
    a = np.full((4, 6144), -8, np.int8)
    b = np.stack([np.full(6144, -8, np.int8), np.full(6144, 7, np.int8)] * 32)
    got = npu.matmul_w4a4(a, b)
    assert got[0, 0] == 6144 * 64 and got[0, 1] == -6144 * 56


def int4_task_buffers(a, b, q, base=0x10000):
    """Hand-made buffers of one stand-alone int4 task (commands q) at fixed addresses."""
    M, K = a.shape
    N = b.shape[0]
    feat = np_pack_input(a, M, 0, K)
    wts = np_pack_weights(b, 0, N, 0, K)
    return [(base, np.asarray(q, np.uint64).view(np.uint8).copy()), (base + 0x10000, feat),
            (base + 0x40000, wts), (base + 0x80000, np.zeros(M * N * 2, np.uint8))]


def run_task(M, K, N, a, b):
    base = 0x10000
    q = npu.matmul_task(M, K, N, base + 0x10000, base + 0x40000, base + 0x80000, "int4")
    bufs = int4_task_buffers(a, b, q, base)
    stats = npu.emulate(bufs, base, npu.pc_amount(104), 1)
    out = bufs[3][1].view("<i2").reshape(N // 8, M, 8).transpose(1, 0, 2).reshape(M, N)
    return stats, out


def test_emulator_int16_check_names_the_task():
    """A stand-alone task may program K > 480 (the hardware limit is 8192): the emulator runs it
    exactly while no summation order can leave int16, and refuses it -- naming the task -- as soon
    as one could: all -8 over K = 512 sums to 32768; K = 1024 with 600 positive and 424 negative
    products ends at 14656, inside int16, but its positive products alone reach 38400."""
    M, N = 4, 64
    a = np.full((M, 448), -8, np.int8)
    stats, out = run_task(M, 448, N, a, np.full((N, 448), -8, np.int8))
    assert stats["tasks"] == 1 and (out == 448 * 64).all()
    a = np.full((M, 512), -8, np.int8)
    with pytest.raises(orkpy.NPUCommandError, match=r"task 0 at 0x00010000 \(int4 x int4 -> int16, 4x512x64\).*"
                                                    r"\(m 0, n 0\) sum to 32768 positive"):
        run_task(M, 512, N, a, np.full((N, 512), -8, np.int8))
    a = np.full((M, 1024), -8, np.int8)
    b = np.zeros((N, 1024), np.int8)
    b[:, :600], b[:, 600:] = -8, 7
    assert int(ref(a, b)[0, 0]) == 14656
    with pytest.raises(orkpy.NPUCommandError, match="38400 positive / -23744 negative, outside int16 in some"):
        run_task(M, 1024, N, a, b)


def test_emulator_refuses_every_single_value_change_of_the_int4_body():
    M, K, N = 4, 64, 64
    rng = np.random.default_rng(5)
    a, b = codes(rng, M, K), codes(rng, N, K)
    base = 0x10000
    q = npu.matmul_task(M, K, N, base + 0x10000, base + 0x40000, base + 0x80000, "int4")
    accepted = []
    for i in range(104):
        m = q.copy()
        m[i] = np.uint64(int(m[i]) + (1 << 16))
        try:
            npu.emulate(int4_task_buffers(a, b, m, base), base, npu.pc_amount(104), 1)
            accepted.append(i)
        except orkpy.NPUCommandError:
            pass
    assert accepted == []


def test_int4_body_differs_from_int8_only_where_the_table_says():
    """The int4 task writes the int8 task's registers in the same order; the values that differ are
    the precision fields, byte sizes, CBUF fields and the int16 output fields -- each a row of the
    unverified table (regcmd.c, int4_register_facts)."""
    i8 = npu.decode(npu.matmul_task(4, 512, 64, 0x1000, 0x2000, 0x3000, "int8"))
    i4 = npu.decode(npu.matmul_task(4, 512, 64, 0x1000, 0x2000, 0x3000, "int4"))
    assert [(r[2], r[3]) for r in i8] == [(r[2], r[3]) for r in i4]
    diff = {r8[6]: (r8[4], r4[4]) for r8, r4 in zip(i8, i4) if r8[4] != r4[4]}
    facts = npu.int4_register_facts()
    code = next(f["value"] for f in facts if f["field"] == "IN_PRECISION")
    out16 = next(f["value"] for f in facts if f["field"] == "OUT_PRECISION")
    size_e = next(f["value"] for f in facts if f["register"] == "DPU_BS_OW_CFG")
    mul = next(f["value"] for f in facts if f["register"] == "DPU_SURFACE_ADD")
    assert diff == {
        "CNA_CONV_CON1": (0, code << 7 | code << 4),
        "CNA_WEIGHT_SIZE0": (512 * 64, 512 * 64 // 2),
        "CNA_WEIGHT_SIZE1": (512, 256),
        "CNA_CBUF_CON1": (8, 4),
        "CORE_MISC_CFG": (0, code << 8),
        "DPU_DATA_FORMAT": (4 << 29, out16 << 29 | code << 26 | code),
        "DPU_BS_OW_CFG": (7 << 8 | 7 << 5 | 7 << 2 | 2, size_e << 8 | size_e << 5 | size_e << 2 | 2),
        "DPU_SURFACE_ADD": ((4 * 8) << 4, (4 * mul) << 4),
    }


def test_the_unverified_table_is_in_the_docs():
    """docs/npu.md's int4 table lists every row of the code's one table with its value (or formula)
    and says unverified where the code does."""
    facts = npu.int4_register_facts()
    assert len(facts) >= 10 and all(f["basis"] for f in facts)
    assert sum(f["basis"].startswith("unverified") for f in facts) >= 8
    doc = (ROOT / "docs" / "npu.md").read_text()
    table = doc[doc.index("### int4 register values"):]
    table = table[:table.index("\n\n", table.index("|---"))]
    rows = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| register")]
    assert len(rows) == len(facts)
    for f, r in zip(facts, rows):
        assert r[0] == f["register"] and r[1] == f["field"], (f, r)
        assert r[2] == (str(f["value"]) if f["value"] is not None else f["formula"]), (f, r)
        assert ("unverified" in r[3]) == ("unverified" in f["basis"]), (f, r)


# ---------------------------------------------------------- device paths --
BACKENDS = [("emu", None), ("rknpu", "rknpu"), ("rocket", "rocket")]


@pytest.mark.parametrize("be,fk", BACKENDS, ids=["emu", "fake-rknpu", "fake-rocket"])
def test_device_int4_weights_matmul_and_mixed_job(be, fk):
    """Through every backend: an int4 weight's matmul is exact; a job chaining an int8 and an int4
    weight runs in one submit and equals the separate matmuls; an int4 weight refuses int8 codes."""
    rng = np.random.default_rng(11)
    with npu.Device(be, fake_kernel=fk) as d:
        a4, b4 = edges(rng, 4, 1000, 130)
        w4 = d.upload(b4, precision="int4")
        assert np.array_equal(d.matmul(a4, w4), ref(a4, b4))
        b8 = rng.integers(-128, 128, (96, 1000), dtype=np.int8)
        w8 = d.upload(b8)
        job = d.job([w8, w4], M=4)
        s0 = d.info()["submits"]
        y8, y4 = job.run([a4, a4])
        assert d.info()["submits"] == s0 + 1
        assert np.array_equal(y8, ref(a4, b8)) and np.array_equal(y4, ref(a4, b4))
        with pytest.raises(ValueError, match="outside"):
            d.matmul(np.full((4, 1000), 9, np.int8), w4)
        with pytest.raises(ValueError, match="cannot run in the int4 mode"):  # int8 codes are not int4 codes
            from orkpy.kernels.packed import pack
            from orkpy.kernels.quant import quantize
            d.upload(pack(quantize(np.ones((64, 64), np.float32), "int8")), precision="int4")


@pytest.mark.parametrize("be", ["rknpu", "rocket"])
def test_dropped_int4_job_is_an_error(be):
    """The output sentinel of an int16 block (0x7fff) is a value no planned int4 task writes."""
    rng = np.random.default_rng(12)
    a, b = edges(rng, 4, 960, 64)
    with npu.Device(be, fake_kernel=be) as d:
        w = d.upload(b, precision="int4")
        assert np.array_equal(d.matmul(a, w), ref(a, b))
        d.set_faults(FAKE_DROP)
        with pytest.raises(orkpy.NPUError, match="did not write its output"):
            d.matmul(a, w)
        d.set_faults(0)
        assert np.array_equal(d.matmul(a, w), ref(a, b))


def test_plan_commands_chain_int4_tasks():
    """An int4 plan's command buffer: 108 qwords per task, every task but the last linked on, and
    the emulator runs the chain to the exact product."""
    M, K, N = 4, 1500, 200
    rng = np.random.default_rng(4)
    a, b = edges(rng, M, K, N)
    p = npu.plan(M, K, N, precision="int4")
    addr = dict(cmd=0x100000, inp=0x1000000, w=0x2000000, out=0x3000000)
    q = npu.plan_commands(M, K, N, addr["cmd"], addr["inp"], addr["w"], addr["out"], precision="int4")
    assert q.size == 108 * p["n_tasks"] and p["n_tasks"] == 4 * 1
    bufs = [(addr["cmd"], q.view(np.uint8).copy()),
            (addr["inp"], npu.layout("pack_input", M, K, N, a, precision="int4").copy()),
            (addr["w"], npu.layout("pack_weights", M, K, N, b, precision="int4").copy()),
            (addr["out"], np.zeros(p["out_bytes"], np.uint8))]
    st = npu.emulate(bufs, addr["cmd"], npu.pc_amount(104), p["n_tasks"])
    assert st["tasks"] == 4
    assert np.array_equal(npu.layout("unpack_output", M, K, N, bufs[3][1], precision="int4"), ref(a, b))
    assert re.search("int4", npu.matmul_w4a4.__doc__)


def test_cli_npu_plan_int4(capsys):
    from orkpy.cli import main
    assert main(["npu-plan", "1", "6144", "2048", "--precision", "int4", "--limit", "2", "--dump"]) == 0
    out = capsys.readouterr().out
    assert "int4 matmul" in out and "13 task(s) (m 1 x k 13 x n 1)" in out and "... 11 more" in out
    assert out.count("OP_EN.PC_OPERATION_ENABLE") == 13
