"""The model's NPU hook plans once per (weight, M) in the KV-cached decode
(csrc/ork/npu/device.c ork_npu_dweight_int_mm; docs/npu.md "Chained jobs and plan reuse"):
each routed NPUWeight keeps planned-once jobs for a few small row counts
(M <= 8, at most 4 per weight, first come), so after the first decoded token
a token costs one submit per routed linear and no planning; larger M or a
full cache plan per call. The emulator runs the exact int8 products the CPU
kernels compute, so the logits equal the CPU decode bit for bit (as
tests/test_act_modes.py asserts of the per-call path). stories260K keeps it
fast."""
import gc

import numpy as np
import pytest

import orkpy
from orkpy.runtime import npu

# the fake kernel drivers are a test-only library (tests/npu_fake), built and loaded by conftest.py
pytestmark = pytest.mark.usefixtures("fake_kernel")

ST = "models/stories260K/stories260K-F32.gguf"
MAX_M, SLOTS = 8, 4  # ORK_NPU_JOB_CACHE_MAX_M, ORK_NPU_JOB_CACHE_SLOTS


@pytest.fixture(scope="module")
def ids(shared):
    m = orkpy.load_model(shared / ST, weights="int8")
    return m.tokens((shared / "text" / "tinystories-val-B.txt").read_text(encoding="utf-8")[:4000])[:60]


def run(m, ids, steps, n_ctx=64, dev=None):
    """Logits of a session fed ids in chunks of ``steps`` rows (all rows of each chunk), and with
    ``dev`` the device's (plans, submits) growth per chunk."""
    s = m.session(n_ctx)
    rows, grow, at = [], [], 0
    for k in steps:
        before = dev.info() if dev else None
        rows.append(s.eval(ids[at:at + k], all_logits=True))  # every row: the output linear runs at M = k
        if dev:
            after = dev.info()
            grow.append((after["plans"] - before["plans"], after["submits"] - before["submits"]))
        at += k
    return np.concatenate(rows), grow


def route(m, dev):
    """Model.route_linears, keeping the NPUWeights (to read their cached job rows)."""
    ws = {}
    for i, (name, spec) in enumerate(m.linears.items()):
        ws[name] = dev.upload(spec.packed_weight())
        m._fwd.set_npu(i, ws[name])
    return ws


@pytest.mark.parametrize("weights", ["int8", "nf4"])
def test_decode_plans_once_then_one_submit_per_linear(shared, ids, weights):
    m = orkpy.load_model(shared / ST, weights=weights)
    steps = [12] + [1] * 8  # a prefill of 12 rows (> MAX_M: planned per call), then 8 decoded tokens
    cpu, _ = run(m, ids, steps)
    d = npu.Device("emu")
    n = m.route_linears(d)
    assert n == len(m.linear_names())
    got, grow = run(m, ids, steps, dev=d)
    assert np.array_equal(got, cpu)  # bit for bit
    assert grow[0] == (n, n)  # prefill: one submit per linear, each planned for the call
    assert grow[1] == (n, n)  # first decoded token: every linear makes its M = 1 job (one plan each)
    for g in grow[2:]:
        assert g == (0, n), "a decoded token must reuse the cached jobs: no plan, one submit per linear"
    got2, grow2 = run(m, ids, steps, dev=d)  # a new session reuses the same jobs
    assert np.array_equal(got2, cpu) and grow2[0] == (n, n) and all(g == (0, n) for g in grow2[1:])


def test_cache_slots_first_come_and_fallback(shared, ids):
    """Ms 1..4 take the four slots; M = 5 (small but the cache is full) and M = 9 (> MAX_M) plan
    per call every time; the row stride of the activations (K rounded up to 32) is honoured."""
    m = orkpy.load_model(shared / ST, weights="nf4")
    assert any(s.K % 32 for s in m.linears.values())  # ffn_down (K = 172): ldq = 192 != K
    steps = [1, 2, 3, 4, 5, 5, 9, 1, 2, 9]
    cpu, _ = run(m, ids, steps)
    d = npu.Device("emu")
    ws = route(m, d)
    n = len(ws)
    got, grow = run(m, ids, steps, dev=d)
    assert np.array_equal(got, cpu)
    assert all(s == n for _, s in grow)  # one submit per linear per eval, cached or not
    plans = [p for p, _ in grow]
    assert plans[:4] == [n] * 4  # 1..4: a new job per linear
    assert plans[4:] == [n, n, n, 0, 0, n]  # 5, 5, 9: planned per call; 1, 2: cached; 9: per call
    for name, w in ws.items():
        assert w.job_rows == (1, 2, 3, 4), name
    assert SLOTS == 4 and MAX_M < 9


def test_close_with_cached_jobs_raises_and_frees(shared, ids):
    """Closing the device while the model holds routed weights with cached jobs frees every
    buffer; the next eval raises a ValueError (no crash). Unrouting frees the jobs with their
    weights."""
    m = orkpy.load_model(shared / ST, weights="nf4")
    d = npu.Device("rknpu", fake_kernel="rknpu")
    live = lambda: d.info()["fake_kernel"]["live_bos"]  # noqa: E731
    n = m.route_linears(d)
    assert live() == n
    run(m, ids, [12, 1, 1])
    with_jobs = live()
    m.route_linears(None)
    gc.collect()
    scratch = live()  # the device's per-call scratch buffers stay
    # routed: every linear's weight + its M = 1 job's cmd / in / out buffers (the 12-row prefill
    # ran planned per call, in the scratch buffers)
    assert with_jobs == scratch + n + 3 * n
    m.route_linears(d)
    s = m.session(64)
    s.eval(ids[:3])
    s.eval(ids[3:4])
    assert d.info()["fake_kernel"]["refused"] == 0
    d.close()
    assert live() == 0
    with pytest.raises(ValueError, match="NPU device of a linear layer was closed"):
        s.eval(ids[4:5])
    with pytest.raises(ValueError, match="NPU device of a linear layer was closed"):
        m.forward(ids[:4])
    m.route_linears(None)  # dropping the weights of a closed device is fine
    assert np.array_equal(m.forward(ids[:4]), orkpy.load_model(shared / ST, weights="nf4").forward(ids[:4]))
