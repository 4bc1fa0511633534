"""Calibration: orkpy's imatrix against llama.cpp's, whole-model
quantization, the saved model directory (manifest, checksums, reload) and
bad input."""
import json
import os

import numpy as np
import pytest

import orkpy
from orkpy.quantization.calibrate import collect_imatrix, quantize_model
from orkpy.cli import read_text_like_llama_cpp

ST = "models/stories260K"


@pytest.fixture(scope="module")
def f32(shared):
    return orkpy.load_model(shared / ST / "stories260K-F32.gguf")


@pytest.fixture(scope="module")
def text(shared):
    return read_text_like_llama_cpp(shared / "text" / "tinystories-val-B.txt")


@pytest.fixture(scope="module")
def our_imatrix(f32, text):
    """The whole text (777 chunks, as llama.cpp's reference imatrix): the gates only."""
    return collect_imatrix(f32, text, n_ctx=256, progress=False)


@pytest.mark.gate
def test_imatrix_matches_llama_cpp(shared, our_imatrix):
    from orkpy.quantization.imatrix import Imatrix
    theirs = Imatrix.load(shared / ST / "stories260K-imatrix-B.dat")
    assert set(theirs.names()) == set(our_imatrix.names())
    worst = 0.0
    for name in theirs.names():
        a, b = our_imatrix.values(name), theirs.values(name)
        worst = max(worst, float(np.max(np.abs(a / b - 1))))
    print(f"\nimatrix E[x^2]: max relative difference orkpy vs llama.cpp {worst:.2e} over {len(theirs.names())} tensors")
    assert worst < 1e-3
    assert our_imatrix.chunks == 777


@pytest.mark.gate
def test_same_scales_from_either_imatrix(shared, our_imatrix):
    from orkpy.quantization.imatrix import Imatrix
    theirs = Imatrix.load(shared / ST / "stories260K-imatrix-B.dat")
    g = orkpy.GGUFFile(shared / ST / "stories260K-F32.gguf")
    same = total = 0
    worst = 0.0
    for name in theirs.names():
        w = g.tensor(name)
        for kind in ("nf4", "int8"):
            s1 = orkpy.quantize(w, kind, imatrix=our_imatrix.values(name)).scales
            s2 = orkpy.quantize(w, kind, imatrix=theirs.values(name)).scales
            same += int(np.sum(s1 == s2))
            total += s1.size
            worst = max(worst, float(np.max(np.abs(s1 / np.where(s2 == 0, 1, s2) - 1))))
    print(f"\nscales chosen with orkpy's vs llama.cpp's imatrix: {same}/{total} identical, max rel diff {worst:.3g}")
    assert same / total > 0.99


@pytest.fixture(scope="module")
def qm(shared, f32, text):
    im = collect_imatrix(f32, text, n_ctx=256, chunks=16, progress=False)  # any imatrix will do here
    return quantize_model(shared / ST / "stories260K-F16.gguf", shared / ST / "stories260K-Q4_0.gguf",
                          imatrix=im, kind="nf4", progress=False, log=lambda m: None)


def test_quantize_model_tiers(qm):
    kinds = {n: pw.kind for n, pw in qm.tensors.items()}
    assert all(k == "int8" for n, k in kinds.items() if "ffn_down" in n)   # F16 in the Q4_0 allocation
    assert all(k == "nf4" for n, k in kinds.items() if "attn_q" in n)
    assert not qm.double_quant and 0 < qm.int8_share() < 1


def test_save_reload_bit_identical_and_manifest(qm, tmp_path, text):
    out = qm.save(tmp_path / "m")
    man = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert man["format"] == "orkpy-quantized-model" and man["settings"]["kind"] == "nf4"
    assert man["imatrix"]["sha256"] and man["source"]["sha256"] and man["alloc"]["sha256"]
    e = man["tensors"]["blk.0.attn_q.weight"]
    assert e["tier"] == "int4" and e["kind"] == "nf4" and e["file"].endswith(".o4n1") and len(e["sha256"]) == 64
    m = orkpy.load_model(out)
    toks = np.arange(1, 200) % 512
    assert np.array_equal(m.forward(toks), qm.to_model().forward(toks))
    assert abs(orkpy.perplexity(m, text, n_ctx=256, chunks=5, progress=False).ppl -
               orkpy.perplexity(qm, text, n_ctx=256, chunks=5, progress=False).ppl) == 0
    with pytest.raises(FileExistsError):
        qm.save(tmp_path / "m")
    qm.save(tmp_path / "m", overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["m"]


def test_checksum_refusal_and_bad_directories(qm, tmp_path):
    out = qm.save(tmp_path / "m")
    blob = os.path.join(out, "blk.1.ffn_up.weight.o4n1")
    data = bytearray(open(blob, "rb").read())
    data[-1] ^= 1
    open(blob, "wb").write(bytes(data))
    with pytest.raises(orkpy.FormatError, match="checksum mismatch for blk.1.ffn_up.weight.o4n1"):
        orkpy.load_model(out)
    os.remove(blob)
    with pytest.raises(orkpy.FormatError, match="missing"):
        orkpy.load_model(out)
    man = os.path.join(out, "manifest.json")
    open(man, "w").write("{not json")
    with pytest.raises(orkpy.FormatError, match="not valid JSON"):
        orkpy.load_model(out)
    open(man, "w").write(json.dumps({"format": "orkpy-quantized-model", "version": 99}))
    with pytest.raises(orkpy.FormatError, match="version 99"):
        orkpy.load_model(out)
    os.remove(man)
    with pytest.raises(orkpy.FormatError, match="no manifest.json"):
        orkpy.load_model(out)


def test_double_quant_is_loud(shared):
    msgs = []
    qm = quantize_model(shared / ST / "stories260K-Q4_0.gguf", shared / ST / "stories260K-Q4_0.gguf",
                        progress=False, log=msgs.append)
    assert qm.double_quant and "DOUBLE QUANT" in msgs[0]


def test_quantize_model_bad_input(shared, tmp_path):
    with pytest.raises(ValueError, match="kind"):
        quantize_model(shared / ST / "stories260K-F16.gguf", shared / ST / "stories260K-Q4_0.gguf", kind="int8")
    other = shared / "models/qwen3-skeleton/qwen3-skel-tied-Q4_K_M.gguf"
    with pytest.raises(ValueError, match="allocation"):
        quantize_model(shared / ST / "stories260K-F16.gguf", other, progress=False, log=lambda m: None)
    with pytest.raises(TypeError, match="Model"):
        collect_imatrix("not a model", "text")


def _to_hf(g):
    """An HF-style checkpoint of a llama GGUF: names mapped back, q/k un-permuted."""
    from orkpy.formats.source import _HF_NAMES, hparams
    inv = {v: k for k, v in _HF_NAMES.items()}
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    hp = hparams(g)
    out = {}
    for t in g.tensors:
        a = g.tensor(t.name)
        if t.name in top:
            out[top[t.name]] = a
            continue
        _, i, key, _ = t.name.split(".")
        if key in ("attn_q", "attn_k"):
            nh = hp["n_head"] if key == "attn_q" else hp["n_head_kv"]
            a = a.reshape(nh, a.shape[0] // nh // 2, 2, a.shape[1]).swapaxes(1, 2).reshape(a.shape)
        out[f"model.layers.{i}.{inv[key]}.weight"] = np.ascontiguousarray(a)
    return out


def test_safetensors_source_equals_gguf_source(shared, tmp_path):
    st_np = pytest.importorskip("safetensors.numpy")
    src = shared / ST / "stories260K-F32.gguf"
    alloc = shared / ST / "stories260K-Q4_0.gguf"
    d = tmp_path / "hf"
    d.mkdir()
    st_np.save_file(_to_hf(orkpy.GGUFFile(src)), str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    a = quantize_model(src, alloc, progress=False, log=lambda m: None)
    b = quantize_model(d, alloc, progress=False, log=lambda m: None)
    assert a.tensors.keys() == b.tensors.keys()
    for n in a.tensors:
        assert np.array_equal(a.tensors[n].store, b.tensors[n].store), n
        assert np.array_equal(a.tensors[n].bscale, b.tensors[n].bscale), n
    toks = np.arange(1, 100)
    assert np.array_equal(a.to_model().forward(toks), b.to_model().forward(toks))
    out = b.save(tmp_path / "q")
    assert np.array_equal(orkpy.load_model(out).forward(toks), a.to_model().forward(toks))
    with pytest.raises(ValueError, match="needs a GGUF"):
        quantize_model(d, orkpy.tier_map(alloc), progress=False, log=lambda m: None)


def test_to_model_caches_per_activation_mode(shared):
    st = shared / "models/stories260K"
    qm = orkpy.quantize_model(st / "stories260K-F16.gguf", st / "stories260K-Q4_0.gguf", progress=False,
                              log=lambda m: None)
    a, b = qm.to_model(), qm.to_model(act="per_tensor")
    assert a is not b and a is qm.to_model()
    toks = np.arange(1, 64)
    assert not np.array_equal(a.forward(toks), b.forward(toks))
    with pytest.raises(ValueError, match="act"):
        qm.to_model(act="bogus")
