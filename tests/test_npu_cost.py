"""The token-cost model of decode on the NPU (orkpy.runtime.npu_cost) and bench/npu_plan.py's
cost section: the arithmetic on a small hand-checkable shape (bytes from the planner's layouts
worked out by hand, submits from the host round trips), the assumptions' dependencies, the
precision maps (W8A8, W4A4, the --mix stand-in rule, --alloc files), today's Qwen3-1.7B figure
kept, and the bench run end to end on a small model. No wall-clock assertions."""
import json

import pytest

from conftest import load_bench
from orkpy.runtime import npu_cost as cost

# one layer, every width 64 but the FFN (128): every matmul is one task
TINY = dict(hidden=64, ffn=128, layers=1, n_head=1, n_head_kv=1, head_dim=64, vocab=64, tied=True)


def test_tiny_shape_by_hand():
    """W8A8, today's schedule: q/k/v | o | gate/up | down | head = 5 submits, 8 tasks. Weights (N, K)
    bytes 4 x 4096 + 3 x 8192 + 4096; packed inputs K bytes (64, down 128); int32 outputs 4N; 864 command
    bytes per task, 896 in a chain (regions 64-byte aligned): 45056 + 576 + 2560 + 7168 = 55360 bytes."""
    w8 = cost.uniform_map(TINY, "int8")
    a = cost.Assumptions(bandwidth_gbs=1.0)
    r = cost.token_cost(TINY, w8, a)
    assert (r["w_bytes"], r["in_bytes"], r["out_bytes"], r["cmd_bytes"]) == (45056, 576, 2560, 7168)
    assert (r["bytes"], r["tasks"], r["submits"], r["bits"]) == (55360, 8, 5, 8.0)
    assert r["ms"] == pytest.approx(55360 / 1e9 * 1e3 + 5 * 0.218)
    assert r["tok_s"] == pytest.approx(1e3 / r["ms"])
    # W4A4: half-byte weights and inputs (64-byte aligned blocks), int16 outputs 2N
    r4 = cost.token_cost(TINY, cost.uniform_map(TINY, "w4a4"), a)
    assert (r4["w_bytes"], r4["in_bytes"], r4["out_bytes"], r4["cmd_bytes"]) == (22528, 512, 1280, 7168)
    assert (r4["tasks"], r4["submits"], r4["bits"]) == (8, 5, 4.0)
    # separate matmuls: one submit each
    assert cost.token_cost(TINY, w8, cost.Assumptions(chain_jobs=False))["submits"] == 8
    # norms and SwiGLU on the NPU: q/k/v | o gate up down head; attention too: one submit
    npu_ew = dict(out_cvt=True, resident_acts=True, npu_elementwise=True)
    r = cost.token_cost(TINY, w8, cost.Assumptions(bandwidth_gbs=1.0, **npu_ew))
    assert r["submits"] == 2 and r["out_bytes"] == 64 * 4 + 128 * 2 + 64 + 64  # int8 outputs, N bytes each
    assert cost.token_cost(TINY, w8, cost.Assumptions(npu_attention=True, **npu_ew))["submits"] == 1
    # async: each submit hides async_hidden_ms, at most the NPU time of the submit before it
    ra = cost.token_cost(TINY, w8, cost.Assumptions(bandwidth_gbs=0.1, async_submit=True, async_hidden_ms=0.1))
    assert ra["t_submit_ms"] == pytest.approx(5 * 0.118)
    ra = cost.token_cost(TINY, w8, cost.Assumptions(bandwidth_gbs=1000.0, async_submit=True))
    assert ra["t_submit_ms"] == pytest.approx(5 * 0.218 - 55360 / 1e12 * 1e3)
    # tasks cost task_us each, shared by the cores
    rt = cost.token_cost(TINY, w8, cost.Assumptions(task_us=3.0, cores=3))
    assert rt["t_tasks_ms"] == pytest.approx(8 * 3.0 / 3 / 1e3)


def test_grouped_int4_precisions_plan_one_k_tile_per_group():
    """w4a8-g32 / w4a4-g64: the per-channel precision's weight bytes and bits, each matmul planned with K
    tiles of its group size (TINY: K = 64, down 128 -> 2 tiles, 4 for down: 18 tasks at g32), its int16
    blocks back to the host: a round trip after its group even with norms and SwiGLU on the NPU."""
    from orkpy.runtime import npu
    a = cost.Assumptions(bandwidth_gbs=1.0)
    r = cost.token_cost(TINY, cost.uniform_map(TINY, "w4a8"), a)
    rg = cost.token_cost(TINY, cost.uniform_map(TINY, "w4a8-g32"), a)
    assert (rg["w_bytes"], rg["bits"], rg["submits"]) == (r["w_bytes"], 4.0, 5)
    assert (r["tasks"], rg["tasks"]) == (8, 6 * 2 + 4 + 2)
    want_out = sum(npu.chain_plan([(2, K, N, "int4")], max_k=32)["out_bytes"] for _, K, N in cost.linears(TINY))
    assert rg["out_bytes"] == want_out > r["out_bytes"]
    assert cost.token_cost(TINY, cost.uniform_map(TINY, "w4a4-g64"), a)["tasks"] == 9  # only down splits
    ew = cost.Assumptions(out_cvt=True, resident_acts=True, npu_elementwise=True)
    assert [len(s) for s in cost.segments(TINY, cost.uniform_map(TINY, "w4a8"), ew)] == [3, 5]
    assert [len(s) for s in cost.segments(TINY, cost.uniform_map(TINY, "w4a8-g32"), ew)] == [3, 1, 2, 1, 1]
    pm = cost.uniform_map(TINY, "w4a8")
    pm["blk.0.attn_output.weight"] = "w4a8-g32"  # only its own output comes back
    assert [len(s) for s in cost.segments(TINY, pm, ew)] == [3, 1, 4]
    assert cost.token_cost(TINY, pm, ew)["out_bytes"] > cost.token_cost(TINY, cost.uniform_map(TINY, "w4a8"), ew)[
        "out_bytes"]
    for bad in ("w4a8-g48", "int8-g32", "w4a8-g512", "w4a8-g032", "w4a8-g", "w4a8-g-32", "w4a8-g\u00b2"):
        with pytest.raises(ValueError, match="precision"):
            cost.uniform_map(TINY, bad)


def test_float_linears_are_host_round_trips():
    """A float linear runs on the host: its group's input comes back and its output goes out."""
    pm = cost.uniform_map(TINY, "int8")
    pm["blk.0.attn_k.weight"] = "float"  # q and v still one submit (k on the host beside them)
    r = cost.token_cost(TINY, pm, cost.Assumptions())
    assert r["submits"] == 5 and r["tasks"] == 7 and r["cpu_linears"] == ["blk.0.attn_k.weight"]
    ew = cost.Assumptions(out_cvt=True, resident_acts=True, npu_elementwise=True)
    pm = cost.uniform_map(TINY, "int8")
    pm["blk.0.ffn_gate.weight"] = "float"  # splits o | up | down head
    assert [len(s) for s in cost.segments(TINY, pm, ew)] == [3, 1, 1, 2]


def test_assumptions_depend_on_each_other():
    with pytest.raises(ValueError, match="npu_elementwise needs out_cvt, resident_acts"):
        cost.Assumptions(npu_elementwise=True).check()
    with pytest.raises(ValueError, match="npu_attention needs npu_elementwise"):
        cost.Assumptions(npu_attention=True).check()
    with pytest.raises(ValueError, match="cores"):
        cost.Assumptions(cores=4).check()
    best = cost.schedule(len(cost.SCHEDULES) - 1)
    assert best.on() == ["async_submit", "out_cvt", "resident_acts", "npu_elementwise", "npu_attention", "cores=3"]
    assert cost.schedule(1).on() == [] and cost.schedule(0).on() == ["no chain_jobs"]
    names = {n for n, _, _, _ in cost.describe(best)}
    assert names == {f for f in cost.Assumptions.__dataclass_fields__}
    assert all(status for _, _, status, _ in cost.describe(best))


def test_mix_rule_and_alloc_files(tmp_path):
    """The stand-in rule at 6.0 bits on TINY (weights q k v o 4096, gate up down 8192, head 4096 =
    45056; 90112 bits to spend, 4 per upgraded weight): attn_v, then ffn_down of layer 0, attn_output
    and the head fit (20480 weights); the rest of the first layer (24576 more) does not."""
    pm, taken = cost.mix_map(TINY, 6.0)
    assert taken == ["attn_v (every layer)", "ffn_down of layer 0", "attn_output (every layer)", "head"]
    assert cost.npu_bits(TINY, pm) == pytest.approx(4 + 4 * 20480 / 45056) and cost.npu_bits(TINY, pm) <= 6.0
    assert cost.mix_map(TINY, 4.0)[0] == cost.uniform_map(TINY, "w4a4")
    with pytest.raises(ValueError, match="budget"):
        cost.mix_map(TINY, 9.0)
    for name in ("qwen3-1.7b", "qwen2.5-1.5b"):
        d = cost.MODELS[name]
        pm, taken = cost.mix_map(d, 5.0)
        assert 4.9 < cost.npu_bits(d, pm) <= 5.0 and taken[:2] == ["attn_v (every layer)", "first and last layer"]
    good = {n: "w4a4" for n, _, _ in cost.linears(TINY)}
    good.pop("output.weight")
    good["token_embd.weight"] = "float"  # the tied head by its embedding's name
    good["blk.0.ffn_down.weight"] = "int8"
    f = tmp_path / "alloc.json"
    f.write_text(json.dumps(good))
    pm = cost.read_alloc(f, TINY)
    assert pm["output.weight"] == "float" and pm["blk.0.ffn_down.weight"] == "int8"
    for bad, match in ((dict(good, extra="int8"), "names no linear"), ({"blk.0.attn_q.weight": "int8"}, "misses"),
                       (dict(good, **{"blk.0.attn_q.weight": "int4"}), "values other than")):
        f.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=match):
            cost.read_alloc(f, TINY)


def test_todays_qwen3_figure_is_kept():
    """W8A8 Qwen3-1.7B, Job chains (today): 1724.1 MB/token at 33.8 GB/s + 113 x 0.218 ms = 75.64 ms,
    13.22 tok/s (docs/npu.md), the same bytes as the bench's submit table."""
    d = cost.MODELS["qwen3-1.7b"]
    r = cost.token_cost(d, cost.uniform_map(d, "int8"), cost.Assumptions())
    assert round(r["bytes"] / 1e6, 1) == 1724.1 and r["submits"] == 113 and r["tasks"] == 215
    assert round(r["ms"], 2) == 75.64 and round(r["tok_s"], 1) == 13.2
    bench = load_bench("npu_plan")
    rows = bench.submit_table(bench.QWEN3_1_7B, bench.shapes(bench.QWEN3_1_7B), 33.8, 1, 1e-3)
    assert rows["chained by shared input (q/k/v, gate/up)"]["bytes"] == r["bytes"]
    r4 = cost.token_cost(d, cost.uniform_map(d, "w4a4"), cost.Assumptions())
    assert r4["tasks"] > 5 * r["tasks"] and r4["w_bytes"] * 2 == pytest.approx(r["w_bytes"], rel=1e-3)


def test_bench_cost_section_runs(capsys, tmp_path):
    bench = load_bench("npu_plan")
    bench.main(["--sections", "cost", "--models", "smollm2-135m", "--mix", "5.0"])
    out = capsys.readouterr().out
    assert "ESTIMATE" in out and "smollm2-135m" in out and "mixed 5 ms" in out
    for lab, _ in cost.SCHEDULES:
        assert lab in out
    assert "task_us" in out and "npu_attention" in out and "ASSUMED" in out and "not modelled" in out
    d = cost.MODELS["smollm2-135m"]
    alloc = {n: ("int8" if "ffn_down" in n else "float" if n == "output.weight" else "w4a4") for n, _, _ in
             cost.linears(d)}
    f = tmp_path / "smol.json"
    f.write_text(json.dumps(alloc))
    bench.main(["--sections", "cost", "--models", "smollm2-135m", "--alloc", str(f), "--cost-bandwidth", "30"])
    out = capsys.readouterr().out
    assert "mixed smol.json" in out and "1 float linears on the host" in out and "GOAL smollm2-135m" in out
    with pytest.raises(SystemExit):
        bench.main(["--sections", "cost", "--alloc", str(f)])  # an alloc file names one model's tensors
