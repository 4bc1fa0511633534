"""--meta: every model-running command takes a safetensors checkpoint, its hyper-parameters and
tokenizer from a GGUF of the same model, with results identical to the GGUF source (issue 15);
and `orkpy dequantize` (the F32 reference of a quantized GGUF) on the shared stories260K files."""
import json

import numpy as np
import pytest

import orkpy
from orkpy.cli import main

ST = ("models", "stories260K")


@pytest.fixture(scope="module")
def hf(shared, tmp_path_factory):
    """stories260K-F32 as a Hugging Face checkpoint folder, and the files of the comparison."""
    st_np = pytest.importorskip("safetensors.numpy")
    from test_calibrate import _to_hf

    src = shared.joinpath(*ST) / "stories260K-F32.gguf"
    d = tmp_path_factory.mktemp("hf")
    st_np.save_file(_to_hf(orkpy.GGUFFile(src)), str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return {"dir": str(d), "gguf": str(src), "alloc": str(shared.joinpath(*ST) / "stories260K-Q4_0.gguf"),
            "text": str(shared / "text" / "tinystories-val-B.txt")}


def _json(capsys, argv):
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_ppl_with_meta_equals_the_gguf_source(hf, capsys):
    common = [hf["text"], "-c", "64", "--chunks", "3", "--no-progress", "--json"]
    ref = _json(capsys, ["ppl", hf["gguf"], *common])
    got = _json(capsys, ["ppl", hf["dir"], *common, "--meta", hf["gguf"]])
    assert (got["ppl"], got["ppl_err"], got["scored"]) == (ref["ppl"], ref["ppl_err"], ref["scored"])
    got = _json(capsys, ["ppl", hf["dir"] + "/model.safetensors", *common, "--meta", hf["gguf"], "--weights", "int8"])
    ref = _json(capsys, ["ppl", hf["gguf"], *common, "--weights", "int8"])
    assert got["ppl"] == ref["ppl"]


def test_imatrix_with_meta_writes_the_same_file(hf, tmp_path, capsys):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert main(["imatrix", hf["gguf"], hf["text"], "-o", str(a), "-c", "64", "--chunks", "3", "--no-progress"]) == 0
    assert main(["imatrix", hf["dir"], hf["text"], "-o", str(b), "-c", "64", "--chunks", "3", "--no-progress",
                 "--meta", hf["gguf"]]) == 0
    assert orkpy.Imatrix.load(a) == orkpy.Imatrix.load(b)


def test_quantize_with_an_emit_map_needs_meta(hf, tmp_path, capsys):
    amap = tmp_path / "alloc.map"
    orkpy.tier_map(hf["alloc"]).save(amap)
    out = tmp_path / "q"
    assert main(["quantize", hf["dir"], "--alloc", str(amap), "-o", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--meta" in err and "safetensors" in err
    assert main(["quantize", hf["dir"], "--alloc", str(amap), "--meta", hf["gguf"], "-o", str(out),
                 "--no-progress"]) == 0
    ref = orkpy.quantize_model(hf["gguf"], hf["alloc"], progress=False, log=lambda m: None)
    m = orkpy.load_model(out)
    toks = np.arange(1, 80)
    assert np.array_equal(m.forward(toks), ref.to_model().forward(toks))
    # the allocation GGUF still supplies the metadata when no --meta is given
    assert main(["quantize", hf["dir"], "--alloc", hf["alloc"], "-o", str(tmp_path / "q2"), "--no-progress"]) == 0


def test_ffn_sweep_and_gate_take_meta(hf, shared, tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    calib = str(shared / "text" / "wikitext-2-raw-test.txt")  # ffn-sweep refuses to calibrate on the scored text
    common = [hf["text"], "--calib", calib, "-c", "64", "--chunks", "2", "--calib-chunks", "2", "--no-progress"]
    assert main(["ffn-sweep", hf["gguf"], *common, "--json-out", str(a)]) == 0
    assert main(["ffn-sweep", hf["dir"], *common, "--json-out", str(b), "--meta", hf["gguf"]]) == 0
    key = lambda p: [(r["mode"], r["exact_layers"], r["ppl"], r["kl"]) for r in map(json.loads, p.read_text().splitlines())]
    assert key(a) == key(b)
    capsys.readouterr()
    gate = ["-c", "64", "--chunks", "2", "--calib-chunks", "2", "--no-progress"]
    assert main(["gate", hf["gguf"], hf["alloc"], hf["text"], *gate]) == 0
    ref = capsys.readouterr().out
    assert main(["gate", hf["dir"], hf["alloc"], hf["text"], *gate, "--meta", hf["gguf"]]) == 0
    got = capsys.readouterr().out
    table = lambda out: [line for line in out.splitlines() if line.startswith(("source (float)", "ours"))]
    assert table(got) == table(ref) and len(table(ref)) == 3


@pytest.mark.parametrize("argv, code, msg", [
    (["ppl", "{dir}", "{text}"], 2, "give --meta GGUF"),
    (["ppl", "{gguf}", "{text}", "--meta", "{gguf}"], 2, "not a safetensors checkpoint"),
    (["imatrix", "{dir}", "{text}", "-o", "{tmp}/x.gguf", "--meta", "{tmp}/nope.gguf"], 1, "no such file"),
    (["ffn-sweep", "{dir}", "{text}", "--calib", "{text}", "--meta", "{text}"], 2, "expected a GGUF"),
    (["gate", "--meta", "{gguf}"], 2, "synthetic"),
])
def test_meta_misuse_is_refused_before_any_work(hf, tmp_path, argv, code, msg, monkeypatch, capsys):
    import orkpy.runtime.model

    def boom(*a, **k):
        raise AssertionError("a model was loaded before --meta was checked")
    monkeypatch.setattr(orkpy.runtime.model, "load_model", boom)
    argv = [a.format(tmp=tmp_path, **hf) for a in argv]
    assert main(argv) == code
    assert msg in capsys.readouterr().err


# ------------------------------------------------------------ dequantize --

@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K_M"])
def test_dequantize_matches_the_gguf_package(shared, tmp_path, name, capsys):
    """The F32 reference of a quantized file: metadata copied (file type ALL_F32), every tensor F32 and
    equal to the gguf package's dequantization, bit for bit."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize

    src = shared.joinpath(*ST) / f"stories260K-{name}.gguf"
    out = tmp_path / "f32.gguf"
    assert main(["dequantize", str(src), "-o", str(out)]) == 0
    assert "every tensor F32" in capsys.readouterr().out
    a, b = gguf.GGUFReader(src), gguf.GGUFReader(out)
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    assert set(a.fields) == set(b.fields)
    for k in a.fields:
        if k.startswith("GGUF.") or k == "general.file_type":
            continue
        assert a.fields[k].types == b.fields[k].types, k
        assert all(np.array_equal(a.fields[k].parts[i], b.fields[k].parts[i]) for i in a.fields[k].data), k
    assert int(b.fields["general.file_type"].parts[-1][0]) == 0
    types = set()
    for ta, tb in zip(a.tensors, b.tensors):
        types.add(ta.tensor_type.name)
        assert tb.tensor_type == gguf.GGMLQuantizationType.F32
        assert np.array_equal(np.asarray(tb.data), dequantize(ta.data, ta.tensor_type)), ta.name
    assert types - {"F32"}, "the file has quantized tensors"
    # the API gives the same bytes; an existing output needs --overwrite; the source is never the output
    api = tmp_path / "api.gguf"
    assert orkpy.dequantize_gguf(src, api) == sorted(types - {"F32"})
    assert api.read_bytes() == out.read_bytes()
    assert main(["dequantize", str(src), "-o", str(out)]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main(["dequantize", str(src), "-o", str(out), "--overwrite"]) == 0
    with pytest.raises(ValueError, match="overwrite its source"):
        orkpy.dequantize_gguf(out, out)
