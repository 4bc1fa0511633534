"""kill -9 in the middle of QuantizedModel.save (a whole model directory, not only
one file): after every kill the directory loads as the old model intact or as
the new one complete, never anything else; nothing half-written loads.

Two children, both saving over an existing model directory:
- one is SIGKILLed after random delays while it saves two models in turn, 32
  times (points anywhere in the save, including inside file writes);
- one kills itself with SIGKILL right before its N-th file-system call (mkdir,
  write-fsync, rename, exchange, unlink, rmdir ...), for every N up to the
  number of calls a save makes: every crash point of the protocol, in order.
"""
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import orkpy.evaluation.synthetic as syn
from orkpy import FormatError
from orkpy.quantization.calibrate import MANIFEST, load_quantized, quantize_model

pytestmark = pytest.mark.slow  # hundreds of child processes

CHILD_COMMON = textwrap.dedent("""
    import os, sys
    import orkpy
    from orkpy.quantization.calibrate import quantize_model
    base, path = sys.argv[1], sys.argv[2]
    src, alloc = os.path.join(base, "synthetic-F16.gguf"), os.path.join(base, "synthetic-alloc.map")
    models = [quantize_model(src, alloc, kind=k, progress=False, log=lambda s: None) for k in ("nf4", "int4")]
""")

CHILD_LOOP = CHILD_COMMON + textwrap.dedent("""
    i = int(sys.argv[3])
    print("ready", flush=True)
    while True:
        models[i % 2].save(path, overwrite=True)
        i += 1
""")

# kill self right before the N-th file-system mutation that save makes
CHILD_POINT = CHILD_COMMON + textwrap.dedent("""
    import ctypes, shutil, signal
    n_kill, new = int(sys.argv[3]), int(sys.argv[4])
    count = [0]
    def wrap(mod, name):
        f = getattr(mod, name)
        def g(*a, **k):
            count[0] += 1
            if count[0] == n_kill:
                os.kill(os.getpid(), signal.SIGKILL)
            return f(*a, **k)
        setattr(mod, name, g)
    for name in ("replace", "rename", "mkdir", "makedirs", "fsync", "unlink", "remove", "rmdir"):
        wrap(os, name)
    import orkpy.formats.modeldir as md
    wrap(md, "_exchange_dirs")
    models[new].save(path, overwrite=True)
    print("completed", count[0], flush=True)
""")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("kill")
    syn.make_synthetic(str(base), n_layer=1, n_embd=64, n_ff=96, n_head=2, n_head_kv=1)
    src, alloc = str(base / "synthetic-F16.gguf"), str(base / "synthetic-alloc.map")
    manifests = []
    for k in ("nf4", "int4"):
        d = base / f"ref-{k}"
        quantize_model(src, alloc, kind=k, progress=False, log=lambda s: None).save(str(d))
        manifests.append(json.loads((d / MANIFEST).read_text()))
    assert manifests[0]["tensors"] != manifests[1]["tensors"]
    return base, manifests


def _which(path, manifests):
    """0 or 1: the model the directory loads as (every checksum verified by load_quantized)."""
    m = load_quantized(str(path))
    for i, ref in enumerate(manifests):
        if m.manifest == ref:
            return i
    raise AssertionError(f"{path} loads, but as neither model: {sorted(m.manifest)}")


def _state(path, manifests):
    try:
        return _which(path, manifests)
    except FormatError as e:
        return f"does not load: {e}"


def _env():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _save_ref(base, path, i):
    r = subprocess.run([sys.executable, "-c", CHILD_POINT, str(base), str(path), "0", str(i)],
                       capture_output=True, text=True, env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr


def test_kill_at_every_file_system_call_of_a_save(setup, tmp_path):
    base, manifests = setup
    path = tmp_path / "model"
    _save_ref(base, path, 0)
    assert _which(path, manifests) == 0
    n, results = 1, []
    while True:
        old = _which(path, manifests)
        new = 1 - old
        r = subprocess.run([sys.executable, "-c", CHILD_POINT, str(base), str(path), str(n), str(new)],
                           capture_output=True, text=True, env=_env(), timeout=120)
        if r.returncode == 0:
            assert "completed" in r.stdout
            assert _which(path, manifests) == new
            break
        assert r.returncode == -signal.SIGKILL, r.stderr
        st = _state(path, manifests)
        results.append((n, old, st))
        assert st in (old, new), f"killed before file-system call {n} of a save (old model {old}, new {new}): {st}"
        n += 1
    assert n > 5, results    # a save makes many calls: the points above were real ones


def test_kill_minus_9_after_random_delays(setup, tmp_path):
    base, manifests = setup
    path = tmp_path / "model"
    _save_ref(base, path, 0)
    rng = random.Random(13)
    seen = set()
    for k in range(32):
        old = _which(path, manifests)
        child = subprocess.Popen([sys.executable, "-c", CHILD_LOOP, str(base), str(path), str(1 - old)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        try:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            time.sleep(rng.uniform(0.0, 0.12))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
            child.stdout.close()
            child.stderr.close()
        st = _state(path, manifests)
        assert st in (0, 1), f"kill {k}: {st}"
        seen.add(st)
    # leftovers of killed saves are hidden temp entries, never the model's own name
    for p in tmp_path.iterdir():
        assert p.name == "model" or p.name.startswith(".model."), p.name
