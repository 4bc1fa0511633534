"""quantize_model, perplexity and ffn-sweep on the two real models (issue 15), through the CLI
and the API, on the F32 reference of each (its exact dequantization, tests/realmodels.py)
with the shipped quantized file's tier map as the allocation oracle.

- SmolLM2-135M: the shipped file is Q4_1 (5.0 bits per weight) everywhere but the tied
  head (Q8_0); at the default threshold 5.0 every linear is int8, so the test uses
  --threshold 5.5: Q4_1 -> nf4, the head int8 (a real int4 mix).
- Gemma-3-270M (Q4_K_M with 640-wide rows, where llama.cpp's K-quants fall back): the tier map
  reads each Q5_0 through the fallback table as the Q4_K llama.cpp intended (issue 19) -> nf4,
  Q6_K / Q8_0 -> int8 at the default threshold.

The imatrix is orkpy's (``orkpy imatrix``) on tinystories, the scored text wikitext; n_ctx
512, Q_CHUNKS chunks. The fused FFN chain runs on both (SiLU for SmolLM2, GELU-tanh for
Gemma, ffn_chain.h) through ``orkpy ffn-sweep`` at a small size (n_ctx 64, one scored chunk):
its identities must hold (the exact path is the per-op model; 0 exact layers is the fused
chain), and its sensitivity rows are there (one calibration chunk, the single-gain proxy: cheap;
the search itself is tested in tests/test_ffn_sensitivity.py). Figures at full size:
bench/real_quant.py.
"""
import json

import numpy as np
import pytest

import orkpy
from orkpy._io import read_text_like_llama_cpp
from orkpy.cli import main

from oracle import real_model
from realmodels import f32_reference

pytestmark = pytest.mark.slow

N_CTX, Q_CHUNKS = 512, 1
THRESHOLD = {"smollm2": 5.5, "gemma3": 5.0}
# (int8, int4, float) linears of the tier map at THRESHOLD: the head counts as a linear (tied: token_embd)
TIERS = {"smollm2": (1, 210, 61), "gemma3": (19, 108, 109)}
WIKI, TINY = "wikitext-2-raw-test.txt", "tinystories-val-B.txt"


def _json(capsys, argv):
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_imatrix_quantize_and_ppl_cli_and_api(shared, tmp_path, name, capsys):
    f32, shipped = str(f32_reference(name)), str(real_model(name))
    wiki, tiny = str(shared / "text" / WIKI), str(shared / "text" / TINY)
    im, qdir, ref = tmp_path / "imatrix.gguf", tmp_path / "q", tmp_path / "ref.npz"
    tm = orkpy.tier_map(shipped, threshold=THRESHOLD[name])
    c = tm.counts_by_tier()
    assert (c["int8"], c["int4"], c["float"]) == TIERS[name]

    assert main(["imatrix", f32, tiny, "-o", str(im), "-c", str(N_CTX), "--chunks", str(Q_CHUNKS),
                 "--no-progress"]) == 0
    assert main(["quantize", f32, "--alloc", shipped, "--imatrix", str(im), "--threshold", str(THRESHOLD[name]),
                 "-o", str(qdir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "int8 share" in out
    common = [wiki, "-c", str(N_CTX), "--chunks", str(Q_CHUNKS), "--no-progress", "--json"]
    base = _json(capsys, ["ppl", f32, *common, "--save-logprobs", str(ref)])
    q = _json(capsys, ["ppl", str(qdir), *common, "--kld-base", str(ref)])
    print(f"\n{name}: F32 {base['ppl']:.4f}, nf4 mix + imatrix (threshold {THRESHOLD[name]}, int8 share "
          f"{tm.int8_share():.1%}) {q['ppl']:.4f}, mean KL {q['kld']['mean']:.4f}, same top "
          f"{q['kld']['same_top']:.3f} ({Q_CHUNKS} chunks of {N_CTX})")
    assert q["config"]["weight_paths"] == ({"nf4": 210, "int8": 1} if name == "smollm2" else {"nf4": 108, "int8": 19})
    assert base["ppl"] < q["ppl"] < 2 * base["ppl"]
    assert 0 < q["kld"]["mean"] < 1 and q["kld"]["same_top"] > 0.5

    # the API gives the same model and the same figure
    qm = orkpy.quantize_model(f32, shipped, imatrix=orkpy.Imatrix.load(im), threshold=THRESHOLD[name],
                              progress=False, log=lambda m: None)
    assert qm.int8_share() == pytest.approx(tm.int8_share())
    text = read_text_like_llama_cpp(wiki)
    r = orkpy.perplexity(qm, text, n_ctx=N_CTX, chunks=Q_CHUNKS, progress=False)
    assert r.ppl == q["ppl"]


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_ffn_sweep_cli(shared, tmp_path, name, capsys):
    f32 = str(f32_reference(name))
    out = tmp_path / "sweep.jsonl"
    assert main(["ffn-sweep", f32, str(shared / "text" / WIKI), "--calib", str(shared / "text" / TINY), "-c", "64",
                 "--chunks", "1", "--calib-chunks", "8", "--sens-chunks", "1", "--sens-method", "single",
                 "--json-out", str(out), "--no-progress"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by = {r["mode"]: r for r in rows}
    n_layer = orkpy.load_model(f32).hparams["n_layer"]
    sprinkles = [r for r in rows if r["mode"] == "sprinkle"]
    assert [len(r["exact_layers"]) for r in sprinkles] == list(range(n_layer + 1))
    assert by["exact_silu"]["ppl"] == by["baseline"]["ppl"] == sprinkles[-1]["ppl"]  # the exact path is per-op
    assert sprinkles[0]["ppl"] == by["fused"]["ppl"] != by["baseline"]["ppl"]
    assert all(np.isfinite(r["ppl"]) and r["kl"] >= 0 for r in rows)
    # the sensitivity sprinkle: 25% of the layers (rounded down), gmax at the same count next to it
    sens, gmax = by["sprinkle_sensitivity"], by["sprinkle_gmax"]
    assert len(sens["exact_layers"]) == len(gmax["exact_layers"]) == n_layer // 4 == len(by["sprinkle_sensitivity_unfused"]["exact_layers"])
    assert gmax == dict(sprinkles[n_layer // 4], mode="sprinkle_gmax") and len(sens["gain"]) == n_layer
    single = sorted(np.argsort(-np.array(sens["gain"]), kind="stable")[: n_layer // 4].tolist())
    # the single-gain choice, unless the gmax layers did better on the calibration text (then those)
    assert sens["exact_layers"] == (single if sens["chose"] == "search" else gmax["exact_layers"])
    assert sens["chose"] == "search" or sens["calib_kl_gmax"] <= sens["calib_kl"]
    print(f"\n{name} ffn-sweep (n_ctx 64, 1 chunk): " + ", ".join(
        f"{m} {by[m]['ppl']:.3f}" for m in ("baseline", "fused", "fp32_silu_out", "exact_lut_input", "asym_zero_point",
                                             "per_channel_out", "unfused", "sprinkle_auto", "sprinkle_gmax",
                                             "sprinkle_sensitivity")))
