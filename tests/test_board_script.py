"""tests/board/run_board.py, the RK3588 board check, run here against the fake
kernels (--fake): exit status, fixtures, the no-device path, and the recipe
step (orkpy quantize on a small model: time and peak memory)."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import orkpy.runtime.npu as npu

# the fake kernel drivers are a test-only library (tests/npu_fake), built and loaded by conftest.py
pytestmark = pytest.mark.usefixtures("fake_kernel")

SCRIPT = pathlib.Path(__file__).resolve().parent / "board" / "run_board.py"


def run(*args, timeout=300):
    """The script in a subprocess that imports the orkpy these tests import (a worktree or a checkout
    other than the installed one: the script's own folder comes first on its sys.path)."""
    import orkpy

    env = dict(os.environ)
    root = str(pathlib.Path(orkpy.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def load_script():
    spec = importlib.util.spec_from_file_location("run_board", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fake_quick_writes_fixtures(tmp_path):
    out = tmp_path / "fixtures"
    r = run("--fake", "--quick", "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ALL EQUAL" in r.stdout

    mod = load_script()
    quick = [s for s in mod.GOLDEN if s[0] * s[1] * s[2] <= mod.QUICK_MACS]
    assert len(quick) >= 3 and any(npu.plan(M, K, N, max_n=mn)["n_tasks"] > 1 for M, K, N, mn in quick)

    run_info = json.loads((out / "board-run.json").read_text())
    assert run_info["ok"] is True and run_info["mode"] == "fake kernel"
    assert run_info["backends"] == ["rknpu", "rocket"]
    assert [s["name"] for s in run_info["shapes"]] == [mod.shape_name(*s) for s in quick]

    for M, K, N, max_n in quick:
        name = mod.shape_name(M, K, N, max_n)
        fx = json.loads((out / f"{name}.json").read_text())
        assert (fx["M"], fx["K"], fx["N"], fx["max_n"]) == (M, K, N, max_n)
        assert fx["ok"] is True
        assert set(fx["results"]) == {"emu", "rknpu", "rocket"}
        n_tasks = fx["plan"]["n_tasks"]
        for be, res in fx["results"].items():
            assert res["ok"] and res["fake"] == (be != "emu")
            assert [c["sha256"] for c in res["calls"]] == fx["reference_sha256"]
            assert res["tasks"] == n_tasks * len(res["calls"])
        # the saved command buffer: 108 qwords per task, the .bin equal to the JSON, both equal to a re-emit
        cmd = fx["commands"]
        q = np.array([int(x, 16) for x in cmd["qwords"]], dtype=np.uint64)
        assert len(q) == n_tasks * 108 and cmd["emulated_equal_reference"] is True
        assert np.array_equal(np.fromfile(out / cmd["bin"], dtype="<u8"), q)
        a = {k: int(v, 16) for k, v in cmd["addresses"].items()}
        again = npu.plan_commands(M, K, N, a["cmd"], a["in"], a["w"], a["out"], max_n=max_n)
        assert np.array_equal(np.asarray(again, dtype=np.uint64), q)
        # the inputs are reproducible from the recorded seed
        a_list, b = mod.inputs(fx["seed"], M, K, N, len(fx["a_sha256"]))
        assert [mod.sha256(x) for x in a_list] == fx["a_sha256"] and mod.sha256(b) == fx["b_sha256"]
    assert not list(out.glob("*.tmp")), "temporary files left behind"
    # the model step: w4a4 / w4a8 / grouped linears through every backend, logits equal to the CPU path's
    md = run_info["model"]
    assert md["ok"] is True and md["model"] == ("stories260K" if mod.shared_models() else "synthetic")
    assert {"w4a4", "w4a8", "w4a8-g32", "int8-g64", "int8"} <= set(md["kinds"])
    assert set(md["results"]) == {"emu", "rknpu", "rocket"}
    assert all(r["ok"] and r["routed"] == md["linears"] and all(r["equal"].values()) for r in md["results"].values())
    assert r.stdout.index("fixture cmds") < r.stdout.index("model step:") < r.stdout.index("quantize: orkpy quantize")
    # the recipe step ran after the shapes, on stories260K when the shared folder has it
    q = run_info["quantize"]
    assert_quantize_report(q, "stories260K" if mod.shared_models() else "synthetic", out)
    assert r.stdout.index("fixture cmds") < r.stdout.index("quantize: orkpy quantize")
    mib = q["peak_rss_bytes"] / 2**20
    assert f"wall {q['wall_s']:.2f} s  cpu {q['cpu_s']:.2f} s  peak RSS {mib:.1f} MiB" in r.stdout


def assert_quantize_report(q, model, out):
    """The recipe step's report: it ran clean, and its time and memory are sane numbers."""
    assert q["ok"] is True and "error" not in q and q["exit_code"] == 0, q
    assert q["model"] == model and q["recipe"]["rounding"]["method"] == "gptq"
    assert isinstance(q["wall_s"], float) and 0.1 < q["wall_s"] < 600 and 0 < q["cpu_s"] < 600 * (q["cpus"] or 1)
    # a Python process with NumPy and orkpy is tens of MiB; the models here are a few MB
    assert isinstance(q["peak_rss_bytes"], int) and 30 * 2**20 < q["peak_rss_bytes"] < 4 * 2**30
    assert q["linears"] > 0 and q["model_bytes"] > 0
    assert "quantized" in (out / q["log"]).read_text()


def test_quantize_step_alone_on_the_synthetic_model(tmp_path, capsys, monkeypatch):
    """--quantize only needs no NPU device; the synthetic model (a board without ../shared); the peak
    memory is the child's own (a child that fails at once reports less than one that quantized, where
    ru_maxrss would give both this process's); a failing child fails the run."""
    mod = load_script()
    monkeypatch.setattr(npu, "unavailable", lambda: {"rknpu": "absent", "rocket": "absent"})
    out = tmp_path / "q"
    rc = mod.main(["--quantize", "only", "--quantize-model", "synthetic", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    info = json.loads((out / "board-run.json").read_text())
    assert info["mode"] == "quantize only" and info["ok"] is True and "shapes" not in info
    assert_quantize_report(info["quantize"], "synthetic", out)
    assert "ALL OK" in text and f"peak RSS {info['quantize']['peak_rss_bytes'] / 2**20:.1f} MiB" in text

    monkeypatch.setattr(mod, "QUANT_RECIPE", {"rounding": {"method": "no-such-method"}})
    bad = tmp_path / "bad"
    rc = mod.main(["--quantize", "only", "--quantize-model", "synthetic", "--out", str(bad)])
    text = capsys.readouterr().out
    q = json.loads((bad / "board-run.json").read_text())["quantize"]
    assert rc == 1 and "FAILED: quantize" in text and q["ok"] is False and q["exit_code"] != 0
    assert "quantize.log" in q["error"] and "no-such-method" in (bad / "quantize.log").read_text()
    assert 0 < q["peak_rss_bytes"] < info["quantize"]["peak_rss_bytes"]


@pytest.mark.parametrize("backend", ["rknpu", "rocket"])
def test_missing_device_exits_2(tmp_path, backend):
    why = npu.unavailable().get(backend)
    if why is None:
        pytest.skip(f"a {backend} device is present on this machine")
    out = tmp_path / "fixtures"
    r = run("--backend", backend, "--out", out)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{backend}: unavailable: {why}" in r.stderr
    assert not out.exists(), "nothing should be written when nothing ran"
    r = run("--backend", backend, "--out", out, "--allow-missing")
    assert r.returncode == 0, r.stdout + r.stderr
    assert backend in r.stderr


def test_mismatch_exits_1(tmp_path, monkeypatch, capsys):
    mod = load_script()
    real = npu.Device.matmul

    def off_by_one(self, a, b, **kw):
        c = real(self, a, b, **kw)
        if self.backend == "rocket":
            c = c.copy()
            c[-1, -1] += 1
        return c

    monkeypatch.setattr(npu.Device, "matmul", off_by_one)
    rc = mod.main(["--fake", "--quick", "--backend", "rocket", "--out", str(tmp_path), "--calls", "1", "--quantize",
                   "skip"])
    text = capsys.readouterr().out
    assert rc == 1
    assert "MISMATCH" in text and "FAILED" in text
    fx = json.loads((tmp_path / "int8_4x64x32.json").read_text())
    assert fx["ok"] is False and fx["results"]["emu"]["ok"] is True
    call = fx["results"]["rocket"]["calls"][0]
    assert call["n_diff"] == 1 and call["first_diff"] == {"m": 3, "n": 31, "got": call["first_diff"]["want"] + 1,
                                                          "want": call["first_diff"]["want"]}
    assert fx["results"]["rocket"]["equal_emu"] is False


def test_model_step_fails_on_a_device_that_fails(tmp_path, monkeypatch, capsys):
    """The model step compares each backend's forward with the CPU path's: a device whose jobs lose their
    output (the fake kernel's drop fault) fails the run and names the step."""
    mod = load_script()
    real = npu.use_npu

    def dropping(model, device, **kw):
        n = real(model, device, **kw)
        if device is not None and getattr(device, "backend", "") == "rocket":
            device.set_faults(4)  # ORK_FAKE_DROP (tests/npu_fake/fake_kernel.h): a job writes no output
        return n

    monkeypatch.setattr(npu, "use_npu", dropping)
    rc = mod.main(["--fake", "--quick", "--int4", "skip", "--backend", "rocket", "--out", str(tmp_path), "--calls",
                   "1", "--quantize", "skip"])
    text = capsys.readouterr().out
    info = json.loads((tmp_path / "board-run.json").read_text())
    assert rc == 1 and "FAILED: model" in text
    assert info["model"]["ok"] is False and info["model"]["results"]["emu"]["ok"] is True
    assert "error" in info["model"]["results"]["rocket"]


def test_int4_step_runs_first_and_names_the_unverified_values(tmp_path, monkeypatch, capsys):
    """The int4 step comes before every int8 shape, prints the unverified register table, runs the int4
    goldens on emu and both fake kernels against the CPU model and writes their fixtures; --int4 only
    runs just it; a device that disagrees fails the run and says the int4 path is not confirmed."""
    out = tmp_path / "fx"
    r = run("--fake", "--quick", "--int4", "only", "--out", out, "--calls", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    text = r.stdout
    assert "int4 x int4 -> int16 FIRST" in text and "IN_PRECISION" in text and "unverified" in text
    mod = load_script()
    info = json.loads((out / "board-run.json").read_text())
    assert info["shapes"] == [] and info["int4"]["ok"] is True
    assert [s["name"] for s in info["int4"]["shapes"]] == [f"int4_{M}x{K}x{N}" for M, K, N in mod.INT4_GOLDEN]
    assert info["int4"]["unverified_registers"] == npu.int4_register_facts()
    fx = json.loads((out / "int4_37x2048x100.json").read_text())
    assert fx["precision"] == "int4" and fx["plan"]["nk"] == 5 and fx["commands"]["emulated_equal_reference"]
    assert all(res["ok"] for res in fx["results"].values()) and set(fx["results"]) == {"emu", "rknpu", "rocket"}
    q = np.fromfile(out / fx["commands"]["bin"], dtype="<u8")
    again = npu.plan_commands(37, 2048, 100, 0x00100000, 0x10000000, 0x20000000, 0x30000000, precision="int4")
    assert np.array_equal(q, again)
    a_list, b = mod.int4_inputs(fx["seed"], 37, 2048, 100, 1)
    assert mod.sha256(b) == fx["b_sha256"] and b.min() == -8 and b.max() == 7

    real = npu.Device.matmul

    def wrong_int4(self, a, w, **kw):
        c = real(self, a, w, **kw)
        if self.backend == "rknpu" and a.max() <= 7 and a.min() >= -8:
            c = c.copy()
            c[0, 0] += 1
        return c

    monkeypatch.setattr(npu.Device, "matmul", wrong_int4)
    rc = mod.main(["--fake", "--quick", "--int4", "only", "--backend", "rknpu", "--out", str(tmp_path / "bad"),
                   "--calls", "1"])
    text = capsys.readouterr().out
    assert rc == 1 and "int4 NOT CONFIRMED" in text and "MISMATCH vs the CPU model" in text
    assert text.index("int4 x int4 -> int16 FIRST") < text.index("FAILED: int4_4x64x64")
