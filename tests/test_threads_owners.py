"""The Python objects a model's settings point into (an NPU route's NPUWeight, a replaced linear's
arrays, an FFN setting's s_scale_ch) are held exactly as long as the core's setting uses them, also
when two threads change one setting at once: the core swaps the owner with the pointer under the
model's lock and the binding drops exactly the owner it replaced (csrc/ork/runtime.h "owners").

A binding that swapped its references after the core call (outside the lock) could keep one
weight while the route ran on the other, whose deallocation then freed what the next forward
used. The tests race two setters many times and check after each race that the setting the
forward actually uses is the one whose object the model holds (sys.getrefcount)."""
import sys
import threading

import numpy as np
import pytest

import orkpy
from orkpy.runtime import npu

pytestmark = pytest.mark.usefixtures("fake_kernel")

ST = "models/stories260K/stories260K-F32.gguf"
RACES = 150


@pytest.fixture
def fast_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _race(*calls):
    barrier = threading.Barrier(len(calls))
    errors = []

    def run(call):
        barrier.wait()
        try:
            call()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    ts = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def _submits(d):
    return d.info()["submits"]


def _refs(objs):
    return [sys.getrefcount(o) for o in objs]


@pytest.mark.parametrize("other", ["set_npu", "set_linear", "unroute"])
def test_npu_route_and_its_weight_agree(shared, fast_switching, other):
    """set_npu(i, w1) races set_npu(i, w2) / set_linear(i, spec) / set_npu(i, None): afterwards the
    model holds a reference to a weight exactly when the forward runs linear i on that weight's device."""
    m = orkpy.load_model(shared / ST, weights="int8")
    spec = next(iter(m._linears.values()))
    core = spec.to_core()
    d1, d2 = npu.Device("emu"), npu.Device("emu")
    w1, w2 = d1.upload(spec.packed_weight()), d2.upload(spec.packed_weight())
    base1, base2 = sys.getrefcount(w1), sys.getrefcount(w2)
    second = {"set_npu": lambda: m._fwd.set_npu(0, w2), "set_linear": lambda: m._fwd.set_linear(0, core),
              "unroute": lambda: m._fwd.set_npu(0, None)}[other]
    toks = np.array([5], np.int32)
    cpu = m.forward(toks, threads=1)
    for _ in range(RACES):
        _race(lambda: m._fwd.set_npu(0, w1), second)
        s1, s2 = _submits(d1), _submits(d2)
        assert np.array_equal(m.forward(toks, threads=1), cpu)
        used = (_submits(d1) > s1, _submits(d2) > s2)
        held = (sys.getrefcount(w1) - base1, sys.getrefcount(w2) - base2)
        assert held == tuple(int(u) for u in used), f"route on {used}, model holds {held}"
    m._fwd.set_npu(0, None)
    assert (sys.getrefcount(w1), sys.getrefcount(w2)) == (base1, base2)
    d1.close()
    d2.close()


def test_ffn_setting_and_its_scales_agree(shared, fast_switching):
    """set_ffn(layer, per_channel_out with s_scale_ch=c1) races the same with c2: afterwards the
    model holds the array whose scales the chain applies, and only that one."""
    m = orkpy.load_model(shared / ST, weights="int8")
    n_ff = m.hparams["n_ff"]
    c1, c2 = np.full(n_ff, 0.01, np.float32), np.full(n_ff, 0.03, np.float32)

    def params(ch):
        return dict(mode="per_channel_out", lut_step=0.01, s_scale=0.02, u_scale=0.02, p_scale=0.001, s_scale_ch=ch)
    h = np.random.default_rng(2).standard_normal((3, m.hparams["n_embd"])).astype(np.float32)
    base = _refs([c1, c2])
    ys = []
    for i in range(2):
        m._fwd.set_ffn(0, params([c1, c2][i]))
        ys.append(m._fwd.ffn_apply(0, h))
    assert not np.array_equal(ys[0], ys[1])
    for _ in range(RACES):
        _race(lambda: m._fwd.set_ffn(0, params(c1)), lambda: m._fwd.set_ffn(0, params(c2)))
        y = m._fwd.ffn_apply(0, h)
        used = (np.array_equal(y, ys[0]), np.array_equal(y, ys[1]))
        held = tuple(r - b for r, b in zip(_refs([c1, c2]), base))
        assert held == tuple(int(u) for u in used), f"chain uses {used}, model holds {held}"
    m._fwd.set_ffn(0, None)  # the per-op path again: the scales are released
    assert _refs([c1, c2]) == base


def test_set_linear_releases_the_linear_it_replaces(shared):
    """A replaced linear's arrays are released (a sensitivity scan swaps linears many times: the
    model holds the current one, not every one it ever ran)."""
    m = orkpy.load_model(shared / ST)  # float32 linears: set_linear keeps the array it is given
    name, spec = next(iter(m._linears.items()))
    w = np.ascontiguousarray(np.asarray(spec.to_core()[1], np.float32))
    toks = np.array([5, 7, 9], np.int32)
    ref = m.forward(toks, threads=1)
    arrays = [w.copy() for _ in range(3)]
    base = _refs(arrays)
    for i in range(3):
        m._fwd.set_linear(0, ("f32", arrays[i]))
        held = [r - b for r, b in zip(_refs(arrays), base)]
        assert held == [int(j == i) for j in range(3)], held
        assert np.array_equal(m.forward(toks, threads=1), ref)


def test_refused_settings_and_a_freed_model_hold_nothing(shared):
    """A setting the core refuses after the binding took the new object's reference gives it back,
    and a model that goes away releases what its settings held (a routed weight, the FFN chain's
    s_scale_ch)."""
    m = orkpy.load_model(shared / ST, weights="int8")
    spec = next(iter(m._linears.values()))
    d = npu.Device("emu")
    w = d.upload(spec.packed_weight())
    n_ff = m.hparams["n_ff"]
    ch = np.full(n_ff, 0.01, np.float32)
    base_w, base_ch = sys.getrefcount(w), sys.getrefcount(ch)
    last = len(m._linears) - 1                      # output.weight: another shape than linear 0
    with pytest.raises(ValueError):
        m._fwd.set_npu(last, w)                     # refused by the core: wrong shape for that linear
    with pytest.raises(ValueError):
        m._fwd.set_ffn(0, dict(mode="per_channel_out", lut_step=0.01, s_scale=0.02, u_scale=0.02, p_scale=0.001,
                               s_scale_ch=ch[:-1]))  # refused: s_scale_ch is not n_ff long
    assert (sys.getrefcount(w), sys.getrefcount(ch)) == (base_w, base_ch)
    m._fwd.set_npu(0, w)
    m._fwd.set_ffn(0, dict(mode="per_channel_out", lut_step=0.01, s_scale=0.02, u_scale=0.02, p_scale=0.001,
                           s_scale_ch=ch))
    assert (sys.getrefcount(w), sys.getrefcount(ch)) == (base_w + 1, base_ch + 1)
    del m
    import gc
    gc.collect()
    assert (sys.getrefcount(w), sys.getrefcount(ch)) == (base_w, base_ch)
    d.close()
