"""The seam between the Python layer and the C forward pass (orkpy/runtime/model.py): named linear
specs, linear names owned by the forward model and used as keys, the public Model methods
calibration / the FFN chain / the NPU use, one source abstraction (GGUF or safetensors) and
one allocation reader for every entry point, and one meaning of the float tier."""
import numpy as np
import pytest

import orkpy
from orkpy.runtime import npu
from orkpy.runtime.model import LinearSpec, linear_names, tier_path
from orkpy.formats.source import GGUFSource, read_allocation

ST = "models/stories260K"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from orkpy.evaluation.synthetic import make_synthetic
    return make_synthetic(str(tmp_path_factory.mktemp("syn")), n_layer=2, n_embd=64, n_ff=96, n_head=2, n_head_kv=1)


def _fw(m, n=40):
    return m.forward(np.arange(1, n), first=0)


# ------------------------------------------------------------ linear names --

def test_linear_names_are_the_forward_models_keys(synthetic):
    m = orkpy.load_model(synthetic["model"], weights="int8")
    names = m.linear_names()
    assert names == linear_names(m.hparams) == list(m.linears)
    assert len(names) == 7 * m.hparams["n_layer"] + 1 and names[-1] == "output.weight"
    assert m.tied and "output.weight" in m.paths          # a tied model's head is still named output.weight
    stats = m.collect_activation_stats(m.chunks(m.tokens(np.arange(1, 200)), 64)[1])
    assert list(stats) == names
    for name, (sums, count) in stats.items():             # the C order matches the names: each K fits
        assert sums.shape == (m.linears[name].K,), name
        assert count == (3 if name == "output.weight" else 3 * 64), name   # the head: each chunk's last position
    im = orkpy.collect_imatrix(m, np.arange(1, 200), n_ctx=64, progress=False)
    assert sorted(im.names()) == sorted(names[:-1])       # the head is left out
    for n in im.names():                                  # the same pass, keyed by the same names
        assert np.array_equal(im.values(n), (stats[n][0] / stats[n][1]).astype(np.float32)), n


def test_linear_names_take_only_the_hyper_parameters():
    hp = {"n_layer": 2}
    assert linear_names(hp)[:2] == ["blk.0.attn_q.weight", "blk.0.attn_k.weight"]
    assert linear_names(hp)[-1] == "output.weight" and len(linear_names(hp)) == 15


# ------------------------------------------------------------- linear spec --

def test_linear_spec_converts_to_the_forward_models_argument():
    w = np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 1000
    f = LinearSpec.f32("x", w)
    assert (f.path, f.N, f.K) == ("f32", 64, 32)
    t = f.to_core()
    assert t[0] == "f32" and np.array_equal(t[1], w)
    pw = orkpy.pack(orkpy.quantize(w, "nf4"))
    p = LinearSpec.from_packed("x", pw, per_tensor_act=True)   # the legacy keywords: an ActSpec
    assert p.act_spec == orkpy.ActSpec("per_tensor", prefix=0) and p.per_tensor_act and p.act == "per_tensor"
    t = p.to_core()                               # one dict per packed linear, its activation spec one value
    assert t[0] == "packed" and t[1]["store"] is pw.store and t[1]["bscale"] is pw.bscale
    assert {k: t[1][k] for k in ("kind", "N", "K", "group")} == {"kind": "nf4", "N": 64, "K": 32, "group": 0}
    assert t[1]["act"] == {"mode": "per_tensor", "bits": 8, "clip": 0.0, "prefix": 0, "outliers": None, "search": False, "digits": False, "group": 0}
    assert LinearSpec.from_packed("x", pw, act_spec=orkpy.ActSpec("per_tensor", prefix=0)).to_core()[1]["act"] == t[1]["act"]
    assert np.array_equal(p.packed_weight().matmul(w[:3]), pw.matmul(w[:3]))
    with pytest.raises(ValueError, match="float linear"):
        f.packed_weight()
    with pytest.raises(ValueError, match="unknown linear path"):
        LinearSpec("x", "fp8", 64, 32).to_core()


def test_model_linears_record_what_runs(synthetic):
    m = orkpy.load_model(synthetic["model"], weights={"default": "int8", "blk.0.attn_q.weight": "gguf"})
    assert m.linears["blk.0.attn_q.weight"].path == "f32"
    s = m.linears["blk.1.ffn_down.weight"]
    assert (s.path, s.kind, s.per_tensor_act) == ("packed", "int8", False)
    assert orkpy.load_model(synthetic["model"], weights="nf4", act="per_tensor").linears["output.weight"].per_tensor_act
    with pytest.raises(TypeError):
        m.linears["blk.0.attn_q.weight"] = s              # read-only


# ------------------------------------------------------ public Model methods --

def test_route_linears_public_and_bit_identical(synthetic):
    m = orkpy.load_model(synthetic["model"], weights={"default": "int8", "blk.0.attn_q.weight": "nf4",
                                                      "blk.0.attn_k.weight": "gguf"})
    cpu = _fw(m)
    dev = npu.Device("emu")
    assert m.route_linears(dev, kinds=("nf4",)) == 1
    assert np.array_equal(_fw(m), cpu)
    assert m.route_linears(dev) == 14                     # every packed linear: 15 minus the float one
    assert np.array_equal(_fw(m), cpu)
    assert m.route_linears(None) == 0
    assert np.array_equal(_fw(m), cpu)


def test_set_ffn_and_ffn_stats_are_model_methods(synthetic):
    from orkpy.evaluation import ffn
    m = orkpy.load_model(synthetic["model"], weights="int8")
    base = _fw(m)
    toks = m.tokens(np.arange(1, 200))
    stats = m.collect_ffn_stats(m.chunks(toks, 64)[1])
    again = ffn.prep(m, toks, n_ctx=64)                   # prep is this method on the text's chunks
    assert len(stats) == len(again) == m.hparams["n_layer"]
    for a, b in zip(stats, again):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    m.set_ffn(1, ffn.layer_params(stats[1], "fused"))
    assert not np.array_equal(_fw(m), base)
    m.set_ffn(1, None)
    assert np.array_equal(_fw(m), base)


def test_one_chunking_for_perplexity_and_imatrix(synthetic):
    m = orkpy.load_model(synthetic["model"])
    toks = m.tokens(np.arange(1, 300))
    n, it = m.chunks(toks, 64, chunks=2)
    chunks = list(it)
    bos = m.tokenizer.bos_id
    assert n == 2 and [c[0] for c in chunks] == [bos, bos] and np.array_equal(chunks[1][1:], toks[65:128])
    assert list(m.chunks(toks, 64, add_bos=False)[1])[1][0] == toks[64]
    for bad in (True, 0, 1.5):                            # one argument check for both (perplexity used to take True)
        with pytest.raises(ValueError, match="chunks must be a positive int"):
            orkpy.perplexity(m, toks, n_ctx=64, chunks=bad, progress=False)
        with pytest.raises(ValueError, match="chunks must be a positive int"):
            orkpy.collect_imatrix(m, toks, n_ctx=64, chunks=bad, progress=False)
    with pytest.raises(ValueError, match="n_ctx"):
        orkpy.perplexity(m, toks, n_ctx=True, progress=False)


def test_as_model_accepts_a_quantized_model_and_refuses_others(synthetic):
    from orkpy.runtime.model import as_model
    qm = orkpy.quantize_model(synthetic["model"], synthetic["alloc"], progress=False, log=lambda s: None)
    assert as_model(qm) is qm.to_model()
    with pytest.raises(TypeError, match="Model"):
        as_model("m.gguf")


# ------------------------------------------------- sources and allocations --

def test_read_allocation_is_the_one_reader(shared, tmp_path):
    gguf = shared / ST / "stories260K-Q4_0.gguf"
    a = read_allocation(gguf)
    assert (a.kind, a.gguf, a.tiers) == ("gguf", str(gguf), orkpy.tier_map(gguf))
    assert a.info()["kind"] == "gguf" and len(a.info()["sha256"]) == 64
    a.tiers.save(tmp_path / "a.map")
    b = read_allocation(tmp_path / "a.map")
    assert (b.kind, b.gguf, b.tiers) == ("emit-map", None, a.tiers)
    c = read_allocation(a.tiers)
    assert c.tiers is a.tiers and c.info() == {"kind": "tiermap", "source": a.tiers.source, "threshold": 5.0}
    assert read_allocation(gguf, threshold=4.0).tiers == orkpy.tier_map(gguf, threshold=4.0)


def test_float_tier_means_float_in_load_model_and_quantize_model(shared, synthetic, tmp_path):
    """A float-tier linear stays float everywhere: load_model(weights=TierMap), quantize_model,
    and the saved and reloaded directory run the same model, bit for bit (quantize_model used
    to refuse the tier). Untied (stories260K, head float) and tied (synthetic, embeddings float)."""
    untied = (shared / ST / "stories260K-F16.gguf", orkpy.tier_map(shared / ST / "stories260K-Q4_0.gguf",
                                                                 output="float"))
    tm = orkpy.TierMap.load(synthetic["alloc"])
    e = tm.entries["token_embd.weight"]
    tm.entries["token_embd.weight"] = orkpy.TierEntry("float", e.ggml_type, e.shape)
    tm.entries["blk.1.attn_q.weight"] = orkpy.TierEntry("float", "F16", tm.entries["blk.1.attn_q.weight"].shape)
    for i, (src, alloc) in enumerate((untied, (synthetic["model"], tm))):
        direct = orkpy.load_model(src, weights=alloc)
        assert direct.paths["output.weight"] == "gguf"
        qm = orkpy.quantize_model(src, alloc, progress=False, log=lambda s: None)
        assert "output.weight" not in qm.tensors and qm.tiers["output.weight"] == "float"
        saved = orkpy.load_model(qm.save(tmp_path / f"m{i}"))
        assert saved.paths == qm.to_model().paths == direct.paths
        assert saved.manifest["tensors"]["output.weight"]["tier"] == "float"
        want = _fw(direct)
        assert np.array_equal(_fw(qm.to_model()), want) and np.array_equal(_fw(saved), want)


def test_load_model_reads_a_safetensors_source(shared, tmp_path):
    st_np = pytest.importorskip("safetensors.numpy")
    from test_calibrate import _to_hf
    src = shared / ST / "stories260K-F32.gguf"
    d = tmp_path / "hf"
    d.mkdir()
    st_np.save_file(_to_hf(orkpy.GGUFFile(src)), str(d / "model.safetensors"))
    for w in ("gguf", "int8"):
        a = orkpy.load_model(src, weights=w)
        b = orkpy.load_model(d, weights=w, meta=src)
        assert np.array_equal(_fw(a), _fw(b))
        assert np.array_equal(b.tokenizer.encode("Once upon"), a.tokenizer.encode("Once upon"))
    tm = orkpy.tier_map(shared / ST / "stories260K-Q4_0.gguf")
    assert np.array_equal(_fw(orkpy.load_model(d / "model.safetensors", weights=tm, meta=src)),
                          _fw(orkpy.load_model(src, weights=tm)))
    with pytest.raises(ValueError, match="needs a GGUF"):
        orkpy.load_model(d)


def test_sources_share_one_interface(shared):
    s = GGUFSource(shared / ST / "stories260K-F16.gguf")
    assert s.tensor_name("output.weight") == "output.weight" and not s.tied
    assert np.array_equal(s.linear("blk.0.attn_q.weight"), s.tensor("blk.0.attn_q.weight"))
    assert s.type_of("blk.0.attn_q.weight") == "F16" and "token_embd.weight" in s.float_names()
    assert tier_path("float") == "gguf" and tier_path("int4", "int4") == "int4" and tier_path("int8") == "int8"
