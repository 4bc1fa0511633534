"""Chained NPU jobs and plan reuse (csrc/ork/npu/plan.h "chains", backend.h
ork_npu_job; docs/npu.md "Chained jobs and plan reuse"): several matmuls with no
data dependency in one command buffer, the last task of matmul i linked through
its PC tail to the first task of matmul i + 1, run by the strict emulator in ONE
submit, equal to the separate matmuls and to a NumPy int64 reference; a job
planned and emitted once and reused. No RK3588 board here: emu and the fake
kernels only."""
import numpy as np
import pytest

import orkpy
from conftest import load_bench
from orkpy.runtime import npu
from orkpy.evaluation.testing import FAKE_HANG

# the fake kernel drivers are a test-only library (tests/npu_fake), built and loaded by conftest.py
pytestmark = pytest.mark.usefixtures("fake_kernel")

BACKENDS = [("emu", None), ("rknpu", "rknpu"), ("rocket", "rocket")]
IDS = ["emu", "fake-rknpu", "fake-rocket"]
# (M, [(K, N), ...], caps): q/k/v-like and gate/up-like runs, unaligned shapes, and small caps that
# force multi-task plans inside every matmul of the chain
CHAINS = [
    (1, [(256, 256), (256, 128), (256, 128)], {}),
    (4, [(64, 96), (64, 32)], {}),
    (3, [(100, 50), (70, 33), (300, 64)], {}),
    (13, [(300, 70), (300, 200), (64, 40)], dict(max_m=4, max_k=64, max_n=32)),
    (1, [(640, 384), (640, 384)], dict(max_k=128, max_n=64)),
]
CIDS = [f"M{m}-{len(mm)}mm{'-caps' if c else ''}" for m, mm, c in CHAINS]


def ref(a, b):
    return a.astype(np.int64) @ b.astype(np.int64).T


def rand(rng, *shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def _chain_buffers(M, mm, caps, rng, addrs=(0x1000, 0x100000, 0x800000, 0x1000000)):
    """Command, input, weight and output buffers of a chain as the emulator sees them."""
    cmd_a, in_a, w_a, out_a = addrs
    shapes = [(M, K, N) for K, N in mm]
    c = npu.chain_plan(shapes, **caps)
    xs = [rand(rng, M, K) for K, _ in mm]
    bs = [rand(rng, N, K) for K, N in mm]
    inbuf = np.zeros(c["in_bytes"], np.uint8)
    bufs, w_addrs, at = [], [], w_a
    for x, b, part in zip(xs, bs, c["parts"]):
        packed = npu.layout("pack_input", M, x.shape[1], b.shape[0], x, **caps)
        assert packed.size == part["in_bytes"]
        inbuf[part["in_off"]:part["in_off"] + packed.size] = packed
        wb = npu.layout("pack_weights", M, x.shape[1], b.shape[0], b, **caps).copy()
        bufs.append((at, wb))
        w_addrs.append(at)
        at += -(-wb.size // 4096) * 4096
    q = npu.chain_commands(shapes, cmd_a, in_a, w_addrs, out_a, **caps)
    out = np.zeros(c["out_bytes"], np.uint8)
    bufs += [(cmd_a, q.view(np.uint8).copy()), (in_a, inbuf), (out_a, out)]
    return c, xs, bs, q, bufs, out


def _outputs(c, M, mm, out, caps):
    return [npu.layout("unpack_output", M, K, N, out[p["out_off"]:p["out_off"] + p["out_bytes"]].copy(), **caps)
            for (K, N), p in zip(mm, c["parts"])]


@pytest.mark.parametrize("M,mm,caps", CHAINS, ids=CIDS)
def test_chained_buffer_runs_in_one_submit(M, mm, caps):
    """The strict emulator executes the whole chained buffer from its first task (one
    submit of n_tasks tasks) and the int32 outputs equal the separate matmuls and NumPy."""
    rng = np.random.default_rng(M * 101 + len(mm))
    c, xs, bs, q, bufs, out = _chain_buffers(M, mm, caps, rng)
    assert c["n_tasks"] == sum(npu.plan(M, K, N, **caps)["n_tasks"] for K, N in mm)
    if caps:
        assert all(p["n_tasks"] > 1 for p in c["parts"])
    stats = npu.emulate(bufs, 0x1000, npu.pc_amount(104), c["n_tasks"])
    assert stats["tasks"] == c["n_tasks"]
    d = npu.Device("emu")
    for x, b, got in zip(xs, bs, _outputs(c, M, mm, out, caps)):
        assert np.array_equal(got, ref(x, b))
        assert np.array_equal(got, d.matmul(x, b, **caps))
    # the link between matmuls: the last task of matmul i points at the first task of matmul i + 1
    for i in range(len(mm) - 1):
        last = (c["parts"][i]["cmd_off"] + (c["parts"][i]["n_tasks"] - 1) * 864) // 8
        nxt = 0x1000 + c["parts"][i + 1]["cmd_off"]
        assert int(q[last + 104]) == (0x0101 << 48) | (nxt << 16) | 0x0010
    last = (c["parts"][-1]["cmd_off"] + (c["parts"][-1]["n_tasks"] - 1) * 864) // 8
    assert int(q[last + 105]) == (0x0101 << 48) | 0x0014  # only the very last task ends the chain


def test_broken_chain_is_an_error_naming_the_task():
    M, mm, caps = 4, [(64, 64), (64, 32), (64, 96)], dict(max_n=32)
    rng = np.random.default_rng(3)
    c, xs, bs, q, bufs, out = _chain_buffers(M, mm, caps, rng)
    n0 = c["parts"][0]["n_tasks"]
    last0 = (c["parts"][0]["cmd_off"] + (n0 - 1) * 864) // 8
    cut = q.copy()
    cut[last0 + 104] = 0
    cut[last0 + 105] = np.uint64(0x0101 << 48 | 0x0014)  # ends the chain after matmul 0
    bufs[-3] = (0x1000, cut.view(np.uint8).copy())
    task_addr = 0x1000 + c["parts"][0]["cmd_off"] + (n0 - 1) * 864
    with pytest.raises(orkpy.NPUCommandError, match=rf"chain ends after task {n0} of {c['n_tasks']} "
                                                    rf"\(task at 0x{task_addr:08x}\)"):
        npu.emulate(bufs, 0x1000, npu.pc_amount(104), c["n_tasks"])
    off = q.copy()
    off[last0 + 104] = np.uint64(int(q[last0 + 104]) + (8 << 16))  # link lands mid-qword
    bufs[-3] = (0x1000, off.view(np.uint8).copy())
    with pytest.raises(orkpy.NPUCommandError, match=f"task at 0x{task_addr:08x} links to .* not 16-byte aligned"):
        npu.emulate(bufs, 0x1000, npu.pc_amount(104), c["n_tasks"])


def test_chain_arguments_are_checked():
    with pytest.raises(ValueError, match="1 to 65536 matmuls"):
        npu.chain_plan([])
    with pytest.raises(ValueError, match="matmul 2 of 2: .*empty dimension"):
        npu.chain_plan([(1, 64, 32), (1, 0, 32)])
    with pytest.raises(ValueError, match="2 addresses for 3 matmuls"):
        npu.chain_commands([(1, 64, 32)] * 3, 0x1000, 0x2000, [0x4000, 0x8000], 0x9000)
    with pytest.raises(ValueError, match="not 64-byte aligned"):
        npu.chain_commands([(1, 64, 32)] * 2, 0x1000, 0x2000, [0x4000, 0x8010], 0x9000)


@pytest.mark.parametrize("be,fk", BACKENDS, ids=IDS)
def test_job_planned_once_and_reused(be, fk):
    """Device.job: the chain is planned and emitted once; every run is one submit with no new
    plan, and its outputs equal separate Device.matmul calls and the reference."""
    d = npu.Device(be, fake_kernel=fk)
    rng = np.random.default_rng(7)
    bs = [rand(rng, N, 320) for N in (96, 32, 64)]
    ws = [d.upload(b, max_n=32, max_k=128) for b in bs]
    i0 = d.info()
    job = d.job(ws, M=4)
    i1 = d.info()
    assert i1["plans"] - i0["plans"] == 1 and i1["submits"] == i0["submits"]
    assert len(job) == 3 and job.M == 4 and job.shapes == [(96, 320), (32, 320), (64, 320)]
    assert job.n_tasks == sum(npu.plan(4, 320, N, max_n=32, max_k=128)["n_tasks"] for N in (96, 32, 64))
    for run in range(3):
        x = rand(rng, 4, 320)
        before = d.info()
        out = job.run(x)  # one input shared by every matmul (q / k / v)
        after = d.info()
        assert after["plans"] == before["plans"], "a reused job must not plan again"
        assert after["submits"] - before["submits"] == 1 and after["tasks"] - before["tasks"] == job.n_tasks
        for got, b, w in zip(out, bs, ws):
            assert np.array_equal(got, ref(x, b))
        sep0 = d.info()
        assert all(np.array_equal(d.matmul(x, w), got) for w, got in zip(ws, out))
        sep1 = d.info()  # separate matmuls: one plan and one submit each
        assert sep1["plans"] - sep0["plans"] == 3 and sep1["submits"] - sep0["submits"] == 3
    xs = [rand(rng, 4, 320) for _ in bs]  # one input per matmul
    assert all(np.array_equal(g, ref(x, b)) for g, x, b in zip(job.run(xs), xs, bs))
    if fk:
        assert d.info()["fake_kernel"]["refused"] == 0
    d.close()
    with pytest.raises(ValueError, match="closed"):
        job.run(xs)
    if fk:  # closing freed the job's three buffers and the weights
        assert d.info()["fake_kernel"]["live_bos"] == 0


def test_job_arguments_and_lifetime():
    d = npu.Device("emu")
    rng = np.random.default_rng(8)
    b = rand(rng, 32, 64)
    job = d.job([b, b], M=1)  # int8 arrays are uploaded for the job
    x = rand(rng, 1, 64)
    r = job.run(x)
    assert np.array_equal(r[0], ref(x, b)) and np.array_equal(r[1], ref(x, b))
    with pytest.raises(ValueError, match=r"input 0 of the job must be \(1, 64\) int8"):
        job.run(rand(rng, 2, 64))
    with pytest.raises(ValueError, match="2 matmuls but got 1 inputs"):
        job.run([x])
    with pytest.raises(TypeError, match="int8"):
        job.run(x.astype(np.int16))
    with pytest.raises(ValueError, match="M must be in"):
        d.job([b], M=0)
    with pytest.raises(ValueError, match="another NPU device"):
        npu.Device("emu").job([d.upload(b)], M=1)
    w = d.upload(b)
    with pytest.raises(ValueError, match="tile caps"):
        d.job([w], M=1, max_n=32)
    job2 = d.job([w], M=3)
    del w  # the job keeps its weight alive
    x3 = rand(rng, 3, 64)
    assert np.array_equal(job2.run(x3)[0], ref(x3, b))


def test_rocket_timeout_drops_the_job_buffers_and_replans():
    """A timed-out rocket job may still run: its buffers are dropped, and the next run
    re-allocates and re-emits (one new plan), then runs correctly."""
    d = npu.Device("rocket", fake_kernel="rocket", timeout_ms=50)
    rng = np.random.default_rng(9)
    b = rand(rng, 64, 64)
    job = d.job([b, b], M=4)
    x = rand(rng, 4, 64)
    d.set_faults(FAKE_HANG)
    with pytest.raises(orkpy.NPUTimeoutError):
        job.run(x)
    d.set_faults(0)
    p0 = d.info()["plans"]
    assert all(np.array_equal(g, ref(x, b)) for g in job.run(x))
    assert d.info()["plans"] == p0 + 1
    assert all(np.array_equal(g, ref(x, b)) for g in job.run(x))
    assert d.info()["plans"] == p0 + 1


def test_bench_submit_counts_for_qwen3_1_7b(capsys):
    """bench/npu_plan.py: 28 layers x 7 matmuls + lm_head = 197 separate submits; chained by
    shared input (q/k/v one job, gate/up one job, o and down alone) 28 x 4 + 1 = 113."""
    bench = load_bench("npu_plan")
    d = bench.QWEN3_1_7B
    assert bench.submits_per_token(d, "separate") == 197
    assert bench.submits_per_token(d, "shared_input") == 113
    assert bench.submits_per_token(dict(d, layers=2), "shared_input") == 9
    with pytest.raises(ValueError, match="unknown schedule"):
        bench.submits_per_token(d, "fused")
    sh = bench.shapes(d)
    rows = bench.submit_table(d, sh, 33.8, 1, 1e-3)
    text = capsys.readouterr().out
    assert "ESTIMATE" in text and "no board here" in text and "16.69" in text
    chained = rows["chained by shared input (q/k/v, gate/up)"]
    sep = rows["separate matmuls, re-planned every call"]
    assert (sep["submits"], chained["submits"]) == (197, 113) and sep["tasks"] == chained["tasks"]
    assert chained["plan_later_s"] == 0 and sep["plan_later_s"] > 0
    # the estimate follows the formula: 1 / (bytes / bandwidth + submits x 0.218 ms)
    assert chained["tok_s"] == pytest.approx(1 / (chained["bytes"] / 33.8e9 + 113 * 0.218e-3))
    assert chained["tok_s"] > sep["tok_s"]
