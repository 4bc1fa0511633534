"""The binding never waits for a core lock (a model's or an NPU device's) while it holds the GIL
(docs/security.md, "Device ... one lock per device, taken without the GIL").

Each test keeps a lock busy in one thread (emulated NPU matmuls hold the device lock, forwards
hold the model lock), lets a second thread call something that needs the same lock, and counts
the ticks of a pure-Python ticker (a thread sleeping 1 ms per tick) during every busy call. A
binding that blocks on the lock with the GIL held freezes the ticker for the rest of the busy
call (about 0 ticks during each), one that releases the GIL first lets it run (tens of ticks
during each). The assertion is a generous count over the busy calls, not a time: the median busy
call must see at least 5 ticks."""
import statistics
import threading
import time

import numpy as np
import pytest

import orkpy
from orkpy.runtime import npu

pytestmark = pytest.mark.usefixtures("fake_kernel")

ST = "models/stories260K/stories260K-F32.gguf"
N_BUSY = 8


class _Ticker:
    def __init__(self):
        self.ticks = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.ticks += 1
            time.sleep(0.001)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def _ticks_during(busy, poll, n=N_BUSY):
    """Ticks of the ticker during each of n calls of busy() while another thread calls poll() in a loop."""
    done = threading.Event()
    started = threading.Event()
    errors = []

    def poller():
        started.set()
        while not done.is_set():
            try:
                poll()
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return
            time.sleep(0.0005)  # a pause that gives up the GIL: only a call that blocks holding it stalls the ticker

    per_call = []
    with _Ticker() as tick:
        p = threading.Thread(target=poller, daemon=True)
        p.start()
        started.wait()
        try:
            busy()  # warm up (plans, caches), not counted
            for _ in range(n):
                t0 = tick.ticks
                busy()
                per_call.append(tick.ticks - t0)
        finally:
            done.set()
            p.join()
    assert not errors, errors
    return per_call


def _assert_ticked(per_call):
    assert statistics.median(per_call) >= 5, f"the Python ticker stalled during the busy calls: {per_call} ticks"


@pytest.fixture(scope="module")
def busy_device():
    """An emu device, a weight whose matmul runs for tens of ms, and a small weight and job."""
    rng = np.random.default_rng(0)
    d = npu.Device("emu")
    big = d.upload(rng.integers(-128, 128, (1024, 4096), dtype=np.int8))
    a = rng.integers(-128, 128, (64, 4096), dtype=np.int8)
    small = d.upload(rng.integers(-128, 128, (32, 64), dtype=np.int8))
    x = rng.integers(-128, 128, (1, 64), dtype=np.int8)
    job = d.job([small], M=1)
    yield d, (lambda: d._dev.matmul(big, a)), small, x, job
    d.close()


POLLS = {
    "info": lambda d, small, x, job: d._dev.info(),
    "matmul": lambda d, small, x, job: d._dev.matmul(small, x),
    "job_run": lambda d, small, x, job: job.run([x]),
    "job_rows": lambda d, small, x, job: small.job_rows,
}


@pytest.mark.parametrize("what", sorted(POLLS))
def test_device_calls_wait_without_the_gil(busy_device, what):
    """One thread runs emu matmuls (the device lock held for tens of ms each), another calls
    `what` on the same device in a loop: the Python ticker keeps ticking during the matmuls."""
    d, busy, small, x, job = busy_device
    _assert_ticked(_ticks_during(busy, lambda: POLLS[what](d, small, x, job)))


def test_set_npu_waits_without_the_gil(shared, busy_device):
    """set_npu checks its weight's device (the device lock): routing a linear to a weight of a busy
    device lets Python run meanwhile."""
    d, busy, *_ = busy_device
    m = orkpy.load_model(shared / ST, weights="int8")
    spec = next(iter(m._linears.values()))
    w = d.upload(spec.packed_weight())
    _assert_ticked(_ticks_during(busy, lambda: m._fwd.set_npu(0, w)))
    m._fwd.set_npu(0, None)


def test_model_calls_wait_without_the_gil(shared):
    """One thread runs forwards (the model lock held), another calls ffn_apply on a layer without an
    FFN chain (refused under the model lock): the Python ticker keeps ticking during the forwards."""
    m = orkpy.load_model(shared / ST, weights="int8")
    toks = np.random.default_rng(1).integers(3, 512, 256).astype(np.int32)
    t0 = time.perf_counter()
    m.forward(toks, threads=1)
    reps = max(1, int(0.03 / max(time.perf_counter() - t0, 1e-4)))  # a busy call of about 30 ms or more
    h = np.zeros((1, m.hparams["n_embd"]), np.float32)

    def busy():
        for _ in range(reps):
            m.forward(toks, threads=1)

    def poll():
        with pytest.raises(ValueError, match="no FFN chain"):
            m._fwd.ffn_apply(0, h)
    _assert_ticked(_ticks_during(busy, poll))
