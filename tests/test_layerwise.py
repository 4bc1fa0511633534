"""The recipe's calibrated stages layer by layer (orkpy/quantization/layerwise.py, issue 39):
byte-identical to the whole-model stages (GPTQ, sequential GPTQ, round-to-nearest, rotated
sources, the activation ranges), a head rounded in row blocks equal to one piece, a killed run
resumed from its checkpoint to the same directory, a checkpoint of other inputs not resumed, and
the peak memory of a calibrated quantization not holding the model."""
import filecmp
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import orkpy
from orkpy.formats.source import open_source, read_allocation
from orkpy.quantization import layerwise
from orkpy.quantization.layerwise import CHECKPOINT_SUFFIX, Checkpoint, LayerwiseRun
from orkpy.quantization.gptq import gptq_linears
from orkpy.quantization.pipeline import RunOptions, plan_linears, round_linears
from orkpy.quantization.recipe import Recipe
from orkpy.runtime.blocks import layer_linears, row_blocks
from orkpy.runtime.model import calibrate_source_acts, linear_names, transformed_source

F32 = "models/stories260K/stories260K-F32.gguf"
Q4KM = "models/stories260K/stories260K-Q4_K_M.gguf"
TEXT = "text/tinystories-val-B.txt"
QUIET = dict(progress=False, log=lambda s: None)


def _calib(shared, n=3000):
    return (shared / TEXT).read_text()[:n * 4]


@pytest.mark.parametrize("method,rotate,seq", [("gptq", None, False), ("rtn", None, False),
                                               ("gptq", "hadamard", False), ("gptq", None, True)])
def test_layer_by_layer_equals_the_whole_model_stages(shared, method, rotate, seq):
    r = Recipe.from_kwargs(kind="nf4", method=method, calib_ctx=64, calib_chunks=3, gptq_sequential=seq)
    src = open_source(str(shared / F32))
    if rotate:
        src = transformed_source(src, rotate, 0)
    names = linear_names(src.hp)
    plan = plan_linears(names, src.split_tier_map(read_allocation(str(shared / Q4KM), 5.0, "infer").tiers),
                        r.allocation)
    assert {p.kind for p in plan.values()} >= {"nf4", "int8"}
    text = _calib(shared)
    run = RunOptions(None, False, lambda s: None)
    kinds = {n: p.kind for n, p in plan.items() if p.kind != "gguf"}
    gq = {} if method != "gptq" else gptq_linears(src, text, kinds, 64, 3, names=list(kinds), progress=False,
                                                   group_size={n: plan[n].group or 0 for n in kinds}, sequential=seq)
    old = {x.name: x.packed for x in round_linears(src, plan, r.rounding, None, {}, gq, None)}
    old_acts = calibrate_source_acts(src, text, 64, 3, None, 1)
    lw = LayerwiseRun(src, plan, r, text, None, {}, run, gptq=method == "gptq", acts=True)
    new = {x.name: x.packed for x in lw}
    assert list(new) == names  # the forward pass's order
    for n in names:
        a, b = old[n], new[n]
        assert (a is None) == (b is None), n
        if a is not None:
            assert a.kind == b.kind and np.array_equal(a.store, b.store) and np.array_equal(a.bscale, b.bscale), n
    assert lw.act_calibration.to_bytes() == old_acts.to_bytes()
    assert set(lw.timings) >= {"forward+gram" if method == "gptq" else "forward", "read"}


def test_gram_batches_pass_count_and_the_same_bytes(shared, block_passes):
    """By default one pass over a layer's rows collects all its Gram matrices (the batch limit is
    twice the largest, what GPTQ holds for it anyway); an explicit max_bytes that holds one matrix
    runs a pass per matrix (the earlier ones on copies of the rows): the same bytes, the same
    activation ranges."""
    r = Recipe.from_kwargs(kind="nf4", method="gptq", calib_ctx=64, calib_chunks=2)
    src = open_source(str(shared / F32))
    plan = plan_linears(linear_names(src.hp), src.split_tier_map(
        read_allocation(str(shared / Q4KM), 5.0, "infer").tiers), r.allocation)
    run = RunOptions(None, False, lambda s: None)
    outs = []
    for mb in (None, 1):
        block_passes.clear()
        lw = LayerwiseRun(src, plan, r, _calib(shared), None, {}, run, True, True, max_bytes=mb)
        outs.append(({x.name: x.packed for x in lw}, lw.act_calibration.to_bytes()))
        n_layer = int(src.hp["n_layer"])
        assert len(block_passes) == (n_layer if mb is None else 4 * n_layer), block_passes  # q (k, v), o, gate (up), down
    (a, acts_a), (b, acts_b) = outs
    assert acts_a == acts_b
    for n in a:
        if a[n] is not None:
            assert np.array_equal(a[n].store, b[n].store) and np.array_equal(a[n].bscale, b[n].bscale), n


@pytest.mark.parametrize("method", ["gptq", "rtn"])
def test_awq_inside_the_run_equals_its_own_pass(shared, block_passes, monkeypatch, method):
    """AWQ searched block by block inside the run (awq.LayerAwq) finds the scales its own pass over
    the float model finds (awq_scales: the same alphas; the magnitudes to float rounding: the rows
    now come through the scaled blocks before), runs one pass a block (GPTQ's Gram matrices scaled
    exactly: diag(1/s) G diag(1/s); the activation statistics from the kept inputs divided by the
    scales) and rounds and calibrates as the scaled source does."""
    from orkpy.quantization import awq
    from orkpy.runtime import blocks
    r = Recipe.from_kwargs(kind="nf4", method=method, calib_ctx=64, calib_chunks=3, awq=True)
    src = transformed_source(open_source(str(shared / F32)), "hadamard", 0)
    names = linear_names(src.hp)
    plan = plan_linears(names, src.split_tier_map(read_allocation(str(shared / Q4KM), 5.0, "infer").tiers),
                        r.allocation)
    text = _calib(shared)
    run = RunOptions(None, False, lambda s: None)
    kinds = {n: p.kind for n, p in plan.items() if p.kind != "gguf"}
    scales, rep = awq.awq_scales(src, text, kinds, n_ctx=64, chunks=3, progress=False)
    lw2 = LayerwiseRun(awq.apply_awq(src, scales), plan, r, text, None, awq.column_scales(src.hp, scales), run,
                       method == "gptq", True)
    two = {x.name: x.packed for x in lw2}
    block_passes.clear()
    la = awq.LayerAwq(src, kinds, 64, 3)
    lw = LayerwiseRun(src, plan, r, text, None, {}, run, method == "gptq", True, awq=la)
    one = {x.name: x.packed for x in lw}
    n_layer = src.hp["n_layer"]
    # one pass a block: its Gram matrices (GPTQ's, or AWQ's inputs' alone), the rows moved on, the
    # block's inputs kept for the scaled inputs' statistics (q for q/k/v, gate for gate/up)
    grams = [n for n in layer_linears(0) if "attn_k" not in n and "attn_v" not in n and "ffn_up" not in n]
    assert [(p[0], p[2], p[3]) for p in block_passes] == [(i, True, [g.replace("blk.0.", f"blk.{i}.") for g in grams])
                                                          for i in range(n_layer)]
    assert all(p[1] for p in block_passes)
    a, b = lw.act_calibration, lw2.act_calibration
    assert list(a.clips("max")) == list(b.clips("max"))
    for m in ("max", "mse"):
        np.testing.assert_allclose(list(a.clips(m).values()), list(b.clips(m).values()), rtol=1e-3)
    assert la.report["alpha"] == rep["alpha"] and list(la.scales) == list(scales)
    for k in scales:
        np.testing.assert_allclose(la.scales[k], scales[k], rtol=1e-5)
    assert lw.src.info()["awq"]["alpha"] == rep["alpha"]
    same = sum(int(np.array_equal(one[n].store, two[n].store)) for n in names if one[n] is not None)
    assert same >= 0.8 * sum(1 for n in names if one[n] is not None), same  # ties of float rounding aside
    for n in names:
        if one[n] is not None:
            a, b = one[n].store.view(np.uint8), two[n].store.view(np.uint8)
            assert np.mean(a != b) < 0.02, n


def test_head_in_row_blocks_equals_one_piece(shared, monkeypatch):
    r = Recipe.from_kwargs(kind="nf4", method="gptq", calib_ctx=64, calib_chunks=2)
    src = open_source(str(shared / F32))
    names = linear_names(src.hp)
    plan = plan_linears(names, src.split_tier_map(read_allocation(str(shared / Q4KM), 5.0, "infer").tiers),
                        r.allocation)
    run = RunOptions(None, False, lambda s: None)
    whole = {x.name: x.packed for x in LayerwiseRun(src, plan, r, _calib(shared), None, {}, run, True, True)}
    N, K = src.shapes()["token_embd.weight"]
    monkeypatch.setattr(layerwise, "HEAD_BLOCK_BYTES", 4 * K * 100)  # 100 rows a block: 512 rows in 6 blocks
    assert len(row_blocks(N, K, layerwise.HEAD_BLOCK_BYTES)) == 6
    blocks = {x.name: x.packed for x in LayerwiseRun(src, plan, r, _calib(shared), None, {}, run, True, True)}
    a, b = whole["output.weight"], blocks["output.weight"]
    assert np.array_equal(a.store, b.store) and np.array_equal(a.bscale, b.bscale)


def _dir_files(d):
    return sorted(os.listdir(d))


@pytest.mark.parametrize("awq", [False, True, "affine"])
def test_a_killed_run_resumes_to_the_same_directory(shared, tmp_path, monkeypatch, awq):
    src = shared / F32
    kw = dict(alloc=shared / Q4KM, calib=_calib(shared), calib_ctx=64, calib_chunks=3, method="gptq",
              rotate="hadamard", awq=awq is True, **QUIET)
    if awq == "affine":  # the NPU's grouped int4 tier with offsets (csrc/ork/affine.h): saved with the layer
        kw.update(alloc=None, npu_bits=4.0, npu_options=("w4a8-g32", "int8"), symmetric=False, act_groups=True)
    full = tmp_path / "full"
    orkpy.quantize_model(src, output=full, **kw)
    assert not os.path.exists(str(full) + CHECKPOINT_SUFFIX)  # removed once the directory is in place

    out = tmp_path / "out"
    save = Checkpoint.save

    def dies_after_layer_3(self, layers, *a):
        save(self, layers, *a)
        if layers == 3:
            raise KeyboardInterrupt("killed")
    monkeypatch.setattr(Checkpoint, "save", dies_after_layer_3)
    with pytest.raises(KeyboardInterrupt):
        orkpy.quantize_model(src, output=out, **kw)
    ck = str(out) + CHECKPOINT_SUFFIX
    assert not out.exists() and json.load(open(os.path.join(ck, "state.json")))["layers"] == 3
    monkeypatch.setattr(Checkpoint, "save", save)
    logs = []
    orkpy.quantize_model(src, output=out, **dict(kw, log=logs.append))
    assert any("resumed after layer 3" in m for m in logs), logs
    assert not os.path.exists(ck)
    assert _dir_files(out) == _dir_files(full)
    match, mismatch, errors = filecmp.cmpfiles(full, out, _dir_files(full), shallow=False)
    assert not mismatch and not errors, (mismatch, errors)
    if awq == "affine":
        assert any(s.boffset is not None for s in orkpy.load_model(out).linears.values())


def test_a_checkpoint_of_other_inputs_is_not_resumed(shared, tmp_path, monkeypatch):
    src = shared / F32
    kw = dict(alloc=shared / Q4KM, calib=_calib(shared), calib_ctx=64, calib_chunks=3, method="gptq", **QUIET)
    out = tmp_path / "out"
    save = Checkpoint.save

    def dies(self, layers, *a):
        save(self, layers, *a)
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(Checkpoint, "save", dies)
    with pytest.raises(KeyboardInterrupt):
        orkpy.quantize_model(src, output=out, **kw)
    monkeypatch.setattr(Checkpoint, "save", save)
    logs = []
    orkpy.quantize_model(src, output=out, **dict(kw, calib_chunks=2, log=logs.append))  # other calibration
    assert any("other inputs: started over" in m for m in logs), logs
    ref = orkpy.quantize_model(src, output=tmp_path / "ref", **dict(kw, calib_chunks=2))
    match, mismatch, errors = filecmp.cmpfiles(ref.path, out, _dir_files(out), shallow=False)
    assert not mismatch and not errors
    # a corrupt checkpoint is started over too
    monkeypatch.setattr(Checkpoint, "save", dies)
    with pytest.raises(KeyboardInterrupt):
        orkpy.quantize_model(src, output=tmp_path / "c", **kw)
    monkeypatch.setattr(Checkpoint, "save", save)
    with open(os.path.join(str(tmp_path / "c") + CHECKPOINT_SUFFIX, "rows.npz"), "wb") as f:
        f.write(b"garbage")
    logs = []
    orkpy.quantize_model(src, output=tmp_path / "c", **dict(kw, log=logs.append))
    assert any("unreadable" in m for m in logs), logs


def test_calibrated_quantization_peak_memory_does_not_hold_the_model(tmp_path):
    """A 24-layer model of 512 x 1536 FFNs (150 MB of F16 weights), GPTQ + activation ranges on
    4 x 256 tokens: layer by layer the peak resident set grows by less than the model's F16 bytes
    (measured 0.69 x: one layer's float32 weights, its Gram matrices, GPTQ's 3 K x K doubles, the
    written 4-bit linears' mapped pages, the statistics); the whole-model stages held the model's
    float32 copy (2 x its F16 bytes) and every Gram matrix."""
    script = textwrap.dedent(f"""
        import sys, numpy as np
        sys.path.insert(0, {os.path.join(os.path.dirname(__file__), '..', 'bench')!r})
        import quant_model as qmb
        qmb.SHAPES["t"] = (512, 1536, 24, 4, 2)
        src, _ = qmb.make_model({str(tmp_path)!r}, "t")
        import orkpy
        from orkpy.formats.tiermap import TierEntry, TierMap
        from orkpy.quantization import pipeline
        shp = qmb.tensors_of("t")
        tm = TierMap({{n: TierEntry("float" if len(s) == 1 else "int4", "F16", s) for n, s in shp.items()}}, tied=True)
        calib = np.random.default_rng(0).integers(0, 1000, 4 * 256).astype(np.int32)
        def hwm():
            return [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
        base = hwm()
        orkpy.quantize_model(src, tm, calib=calib, calib_ctx=256, calib_chunks=4, method="gptq",
                             output={str(tmp_path / 'out')!r}, progress=False, log=lambda s: None)
        print(hwm() - base, src.stat().st_size)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    grown, size = [int(v) for v in out.stdout.split()]
    assert size > 140e6
    assert grown < 0.8 * size, (grown, size)


def test_no_resume_writes_no_checkpoint(shared, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(Checkpoint, "save", lambda self, *a: calls.append(a))
    orkpy.quantize_model(shared / F32, shared / Q4KM, calib=_calib(shared), calib_ctx=64, calib_chunks=2,
                         output=tmp_path / "out", resume=False, **QUIET)
    assert not calls and not os.path.exists(str(tmp_path / "out") + CHECKPOINT_SUFFIX)
    from orkpy.cli import main
    assert main(["quantize", str(shared / F32), "--alloc", str(shared / Q4KM), "--calib",
                 str(shared / TEXT), "--calib-chunks", "2", "--calib-ctx", "64", "-o", str(tmp_path / "cli"),
                 "--no-resume", "--no-progress"]) in (0, None)
    assert not calls and (tmp_path / "cli" / "manifest.json").exists()


def test_float_tables_written_in_row_blocks_give_the_same_file(shared, tmp_path, monkeypatch):
    """float.gguf's large tables (an embedding) are read and written in blocks of rows: the same
    bytes as whole (a rotated source too: its table is computed per block)."""
    from orkpy.formats import modeldir
    kw = dict(alloc=shared / Q4KM, rotate="hadamard", **QUIET)
    whole = orkpy.quantize_model(shared / F32, output=tmp_path / "whole", **kw)
    monkeypatch.setattr(modeldir, "ROWS_BYTES", 4 * 64 * 50)  # 50 rows of the 64-wide table a block
    blocks = orkpy.quantize_model(shared / F32, output=tmp_path / "blocks", **kw)
    a = open(os.path.join(whole.path, "float.gguf"), "rb").read()
    assert a == open(os.path.join(blocks.path, "float.gguf"), "rb").read()


def test_lazy_tensor_blocks_are_checked(tmp_path):
    from orkpy.formats.gguf_write import LazyTensor, write_gguf
    meta = [("general.architecture", "STRING", "llama")]
    ok = LazyTensor((5, 3), np.float32, lambda: iter([np.ones((2, 3), np.float32), np.zeros((3, 3), np.float32)]),
                    blocks=True)
    write_gguf(tmp_path / "a.gguf", meta, [("t", ok)])
    g = orkpy.GGUFFile(tmp_path / "a.gguf")
    np.testing.assert_array_equal(g.tensor("t"), np.vstack([np.ones((2, 3)), np.zeros((3, 3))]))
    short = LazyTensor((5, 3), np.float32, lambda: iter([np.ones((2, 3), np.float32)]), blocks=True)
    with pytest.raises(ValueError, match="declared"):
        write_gguf(tmp_path / "b.gguf", meta, [("t", short)])
    wrong = LazyTensor((5, 3), np.float32, lambda: iter([np.ones((5, 3), np.float16)]), blocks=True)
    with pytest.raises(ValueError, match="block of float16"):
        write_gguf(tmp_path / "c.gguf", meta, [("t", wrong)])
    long = LazyTensor((2, 3), np.float32, lambda: iter([np.ones((2, 3), np.float32)] * 3), blocks=True)
    with pytest.raises(ValueError, match="declared"):
        write_gguf(tmp_path / "d.gguf", meta, [("t", long)])
    assert not (tmp_path / "b.gguf").exists() and not (tmp_path / "c.gguf").exists()


@pytest.mark.slow
def test_kill_9_then_resume_gives_the_same_directory(tmp_path):
    """A real kill -9 of `orkpy quantize --calib` after some layers are saved (a 24-layer model, GPTQ),
    then the same command again: it resumes (said on stderr) and writes the uninterrupted run's bytes."""
    import signal
    import time
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    import quant_model as qmb
    qmb.SHAPES["k9"] = (256, 768, 24, 2, 1)
    src, _ = qmb.make_model(str(tmp_path), "k9")
    calib = tmp_path / "calib.txt"
    calib.write_text(" ".join(f"w{i % 97} x{i % 13}" for i in range(6000)))
    shp = qmb.tensors_of("k9")
    from orkpy.formats.tiermap import TierEntry, TierMap
    tm = TierMap({n: TierEntry("float" if len(s) == 1 else "int4", "F16", s) for n, s in shp.items()}, tied=True)
    alloc = tmp_path / "alloc.emit"
    tm.save(alloc)

    def cmd(out):
        return [sys.executable, "-m", "orkpy", "quantize", str(src), "--alloc", str(alloc), "--calib", str(calib),
                "--calib-chunks", "4", "--calib-ctx", "128", "--method", "gptq", "--rotate", "hadamard",
                "-o", str(out), "--no-progress"]
    subprocess.run(cmd(tmp_path / "full"), check=True, capture_output=True)
    out = tmp_path / "out"
    state = str(out) + CHECKPOINT_SUFFIX + "/state.json"
    p = subprocess.Popen(cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while time.time() - t0 < 600:
        try:
            if json.load(open(state))["layers"] >= 6:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    done = json.load(open(state))["layers"]
    assert 6 <= done < 24 and not out.exists()
    r = subprocess.run(cmd(out), check=True, capture_output=True, text=True)
    assert f"resumed after layer {done}" in r.stderr, r.stderr[-2000:]
    assert not os.path.exists(state)
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "full", out, _dir_files(tmp_path / "full"), shallow=False)
    assert not mismatch and not errors and _dir_files(out) == _dir_files(tmp_path / "full")
