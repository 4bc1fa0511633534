"""The architecture table (orkpy/formats/arch.py) and the C forward pass on every architecture:
small synthetic models (tests/archgen.py, written with orkpy's GGUF writer) against a float64
NumPy forward pass written from llama.cpp's graphs; the hyper-parameter rules (sliding-window
patterns, RoPE bases, Gemma's attention scale, soft-caps); phi3's fused tensors split at load
for tier maps, quantize_model, the imatrix and model directories; the strict checks.
The same models against the live llama.cpp: tests/test_arch_oracle.py."""
import numpy as np
import pytest

import orkpy
from orkpy import _core, arch
from orkpy.formats.gguf_write import write_gguf
from orkpy.formats.source import open_source

import archgen

# float32 (C) vs float64 (reference): max |logit diff| below REL x std(logits), KL below KL_MAX nats
REL, KL_MAX = 5e-4, 1e-8

CASES = {
    "llama": dict(arch="llama"),
    "llama-biases-rope_freqs": dict(arch="llama", qkv_bias=True, ffn_bias=True, rope_freqs=True),
    "llama-tied-fused_qkv": dict(arch="llama", tied=True, fused_qkv=True),
    "qwen2": dict(arch="qwen2", output_bias=True),
    "qwen3": dict(arch="qwen3", hd=24),
    "gemma": dict(arch="gemma", hd=32, HKV=4),  # 7B-shaped: one KV head per head, head size 32 != n_embd/n_head
    "gemma-mqa-converter-keys": dict(arch="gemma", HKV=1, converter_keys=True),  # 2B-shaped; no RoPE keys
    "gemma2": dict(arch="gemma2", n_swa=16, attn_softcap=5.0, final_softcap=3.0),
    "gemma2-window-2": dict(arch="gemma2", n_swa=2, pattern=0),  # every layer a window shorter than 3 rows
    "gemma3": dict(arch="gemma3", hd=32, HKV=1, n_layer=7, pattern=3, n_swa=16, rope_base=1e6, final_softcap=4.0),
    "phi3": dict(arch="phi3", qkv_bias=True),
    "phi3-longrope": dict(arch="phi3", longrope=(64, 1.19)),
}


def _make(tmp_path, case, **over):
    kw = dict(CASES[case], **over)
    a = kw.pop("arch")
    p = tmp_path / f"{case}.gguf"
    T, c = archgen.make(a, p, **kw)
    return p, T, c


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_float64_reference(tmp_path, case):
    p, T, c = _make(tmp_path, case)
    m = orkpy.load_model(p)
    tok = archgen.tokens(64 if "longrope" in case else 150)  # 150: three attention blocks of 64 query rows
    diff, rel, kl = archgen.compare(m.forward(tok), archgen.ref_forward(T, c, tok))
    assert rel < REL and kl < KL_MAX, (case, diff, rel, kl)
    assert m.linear_names() == orkpy.runtime.model.linear_names(m.hparams)  # one order for every architecture
    np.testing.assert_array_equal(m.forward(tok, threads=1), m.forward(tok, threads=2))


def test_table_covers_the_issue_and_unknown_architectures_list_it(tmp_path):
    assert set(arch.SUPPORTED) >= {"llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3"}
    p, _, _ = _make(tmp_path, "llama")
    md = [t for t in orkpy.formats.gguf_write.metadata_triples(str(p)) if t[0] != "general.architecture"]
    bad = tmp_path / "bloom.gguf"
    write_gguf(bad, [("general.architecture", "STRING", "bloom")] + md,
               [("token_embd.weight", np.zeros((4, 4), np.float32))])
    with pytest.raises(ValueError) as e:
        orkpy.load_model(bad)
    assert "bloom" in str(e.value) and str(bad) in str(e.value)
    for a in arch.SUPPORTED:
        assert a in str(e.value)


def _hp(a, n_layer=18, D=640, H=4, hd=256, **keys):
    md = {"general.architecture": a, f"{a}.block_count": n_layer, f"{a}.embedding_length": D,
          f"{a}.feed_forward_length": 2048, f"{a}.attention.head_count": H, f"{a}.attention.head_count_kv": 1,
          f"{a}.attention.key_length": hd, f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
          f"{a}.rope.freq_base": 1e6}
    md.update({f"{a}.{k}": v for k, v in keys.items()})
    A = arch.get(a)
    shapes = {"token_embd.weight": (100, D), "output_norm.weight": (D,)}
    for i in range(n_layer):
        for r in A.norms:
            shapes[f"blk.{i}.{arch.NORM_STEMS[r]}.weight"] = (hd if r in ("q_norm", "k_norm") else D,)
    return arch.hparams(md, shapes, "x.gguf")


def test_sliding_window_patterns_rope_bases_and_scales():
    g3 = _hp("gemma3", **{"attention.sliding_window": 512})  # Gemma-3-270M's metadata
    assert g3["swa_layers"] == [i for i in range(18) if i % 6 != 5] and g3["n_swa"] == 512
    assert g3["rope_base_swa"] == 10000.0 and g3["rope_freq_scale_swa"] == 1.0 and g3["rope_base"] == 1e6
    assert g3["gate_fn"] == "gelu_tanh" and g3["final_softcap"] == 0.0 and g3["attn_softcap"] == 0.0
    assert g3["embd_scale"] == float(np.sqrt(np.float32(640)))
    assert g3["attn_scale"] == float(np.float32(1) / np.sqrt(np.float32(256)))
    assert _hp("gemma3")["swa_layers"] == []  # no window key: no sliding window
    assert _hp("gemma3", **{"attention.sliding_window": 8, "attention.sliding_window_pattern": 3,
                            "rope.freq_base_swa": 5e4})["swa_layers"] == [i for i in range(18) if i % 3 != 2]
    flags = [True, False] * 9
    assert _hp("gemma3", **{"attention.sliding_window": 8, "attention.sliding_window_pattern": flags}
               )["swa_layers"] == list(range(0, 18, 2))
    g2 = _hp("gemma2", n_layer=6, D=64, hd=16)
    assert g2["swa_layers"] == [0, 2, 4] and g2["n_swa"] == 4096 and g2["rope_base_swa"] == 1e6
    assert (g2["attn_softcap"], g2["final_softcap"]) == (50.0, 30.0)
    # Gemma's attention scale: 1/sqrt(n_embd // n_head) for the 27B layer counts, else 1/sqrt(head_dim)
    big2 = _hp("gemma2", n_layer=46, D=4608, H=32, hd=128)
    assert big2["attn_scale"] == float(np.float32(1) / np.sqrt(np.float32(4608 // 32)))
    big3 = _hp("gemma3", n_layer=62, D=5376, H=32, hd=128)
    assert big3["attn_scale"] == float(np.float32(1) / np.sqrt(np.float32(5376 // 32)))
    # phi3's window is read and ignored (llama.cpp disables it)
    assert _hp("phi3", n_layer=2, D=64, hd=16, **{"attention.sliding_window": 8})["swa_layers"] == []
    with pytest.raises(NotImplementedError, match="yarn"):
        _hp("llama", n_layer=2, D=64, hd=16, **{"rope.scaling.type": "yarn"})


def test_gemma1_hparams_read_what_llama_cpp_reads():
    """Gemma 7B's metadata (18 layers kept short): 1/sqrt(head size 256), not 1/sqrt(n_embd / n_head
    = 192); sqrt(n_embd) embeddings; window and soft-cap keys are not read (src/models/gemma.cpp
    reads none), so they change nothing."""
    g = _hp("gemma", n_layer=2, D=3072, H=16, hd=256, **{"attention.sliding_window": 8,
                                                          "attn_logit_softcapping": 50.0,
                                                          "final_logit_softcapping": 30.0})
    assert g["attn_scale"] == float(np.float32(1) / np.sqrt(np.float32(256))) == 1 / 16
    assert g["embd_scale"] == float(np.sqrt(np.float32(3072))) and g["gate_fn"] == "gelu_tanh"
    assert g["rope_type"] == arch.ROPE_TYPES["neox"] and g["rope_base"] == 1e6
    assert (g["swa_layers"], g["n_swa"], g["attn_softcap"], g["final_softcap"]) == ([], 0, 0.0, 0.0)


def test_sliding_window_masks(tmp_path):
    """Every layer windowed (pattern 0), window w, L layers: a logit at t sees tokens
    t - L(w-1) .. t only; with Gemma 2's global layers every token is seen."""
    w, L, n = 6, 2, 40
    p, _, _ = _make(tmp_path, "gemma2", n_swa=w, pattern=0, n_layer=L)
    m = orkpy.load_model(p)
    a = archgen.tokens(n)
    b = a.copy()
    b[0] = (a[0] + 7) % archgen.N_VOCAB
    la, lb = m.forward(a), m.forward(b)
    reach = L * (w - 1)
    assert np.array_equal(la[reach + 1:], lb[reach + 1:])
    assert not np.array_equal(la[reach], lb[reach])
    p2, _, _ = _make(tmp_path, "gemma2", n_swa=w, n_layer=L)  # layer 1 global
    m2 = orkpy.load_model(p2)
    assert not np.array_equal(m2.forward(a)[-1], m2.forward(b)[-1])


def test_soft_caps_bound_the_logits(tmp_path):
    p, _, _ = _make(tmp_path, "gemma2", final_softcap=1.5, scale=3.0)
    logits = orkpy.load_model(p).forward(archgen.tokens(32))
    assert np.abs(logits).max() <= 1.5 and np.abs(logits).max() > 1.0


def test_phi3_fused_tensors_split_for_tier_maps_quantize_imatrix_and_model_dirs(tmp_path):
    p, T, c = _make(tmp_path, "phi3")  # with q/k/v biases in attn_qkv.bias
    src = open_source(p)
    shapes = src.shapes()
    assert "blk.0.attn_qkv.weight" not in shapes and shapes["blk.0.attn_q.weight"] == (64, 64)
    assert shapes["blk.0.ffn_gate.weight"] == shapes["blk.0.ffn_up.weight"] == (96, 64)
    qkv, up = T["blk.0.attn_qkv.weight"], T["blk.0.ffn_up.weight"]
    np.testing.assert_array_equal(src.tensor("blk.0.attn_k.weight"), qkv[64:96])
    np.testing.assert_array_equal(src.tensor("blk.0.attn_v.weight"), qkv[96:])
    np.testing.assert_array_equal(src.tensor("blk.0.ffn_gate.weight"), up[:96])  # the gate is the first half
    np.testing.assert_array_equal(src.tensor("blk.0.ffn_up.weight"), up[96:])
    np.testing.assert_array_equal(src.tensor("blk.1.attn_k.bias"), T["blk.1.attn_qkv.bias"][64:96])
    assert src.type_of("blk.0.ffn_gate.weight") == "F32"
    # a tier map made from the phi3 file names the fused tensors; each part gets its tier
    tm = orkpy.tier_map(p)
    assert "blk.0.attn_qkv.weight" in tm
    entries = dict(tm.entries)
    entries["blk.1.attn_qkv.weight"] = orkpy.formats.tiermap.TierEntry("int4", "Q4_K", entries["blk.1.attn_qkv.weight"].shape)
    tm = orkpy.TierMap(entries, tm.threshold, tm.source, tm.tied)
    m = orkpy.load_model(p, weights=tm)
    assert m.paths["blk.1.attn_k.weight"] == "nf4" and m.paths["blk.0.attn_k.weight"] == "int8"
    assert m.paths["blk.1.ffn_gate.weight"] == "int8"
    ref = orkpy.load_model(p)
    tok = archgen.tokens(48)
    by_name = orkpy.load_model(p, weights={n: m.paths[n] for n in m.linear_names()})
    np.testing.assert_array_equal(m.forward(tok), by_name.forward(tok))
    # the imatrix is keyed by the split names; q, k and v see the same inputs
    stats = ref.collect_activation_stats([tok])
    np.testing.assert_array_equal(stats["blk.0.attn_q.weight"][0], stats["blk.0.attn_v.weight"][0])
    np.testing.assert_array_equal(stats["blk.0.ffn_gate.weight"][0], stats["blk.0.ffn_up.weight"][0])
    # quantize_model with the phi3 file as its own allocation, saved and reloaded
    qm = orkpy.quantize_model(p, alloc=tm, progress=False, log=lambda s: None)
    assert set(qm.tiers) == set(ref.linear_names())
    out = qm.save(tmp_path / "phi3-dir")
    re = orkpy.load_model(out)
    np.testing.assert_array_equal(re.forward(tok), qm.to_model().forward(tok))


def test_biases_on_packed_and_npu_paths(tmp_path):
    """The bias is added after the product on every path: with the same packed head, logits with
    and without output.bias differ by the bias; the NPU emulator path is bit-identical."""
    import orkpy.runtime.npu as npu

    p, T, c = _make(tmp_path, "qwen2")
    p0 = tmp_path / "nobias.gguf"
    write_gguf(p0, orkpy.formats.gguf_write.metadata_triples(str(p)), [(n, a) for n, a in T.items() if n != "output.bias"])
    tok = archgen.tokens(48)
    for w in ("int8", "nf4"):
        with_b, without = (orkpy.load_model(f, weights=w) for f in (p, p0))
        assert with_b.hparams["biases"] == ["attn_q", "attn_k", "attn_v", "output"]
        lb, l0 = with_b.forward(tok), without.forward(tok)
        np.testing.assert_allclose(lb - l0, np.broadcast_to(T["output.bias"], lb.shape), atol=2e-5)
        with_b.route_linears(npu.Device("emu"))
        np.testing.assert_array_equal(with_b.forward(tok), lb)


def test_strict_tensor_checks(tmp_path):
    p, T, c = _make(tmp_path, "gemma2")
    md = orkpy.formats.gguf_write.metadata_triples(str(p))

    def variant(name, drop=(), add=()):
        q = tmp_path / f"{name}.gguf"
        write_gguf(q, md, [(n, a) for n, a in T.items() if n not in drop] + list(add))
        return q

    with pytest.raises(ValueError, match="post_ffw_norm.*missing"):
        orkpy.load_model(variant("nopost", drop=("blk.1.post_ffw_norm.weight",)))
    with pytest.raises(ValueError, match="not used by architecture 'gemma2'"):
        orkpy.load_model(variant("untied", add=[("output.weight", T["token_embd.weight"])]))
    with pytest.raises(ValueError, match="blk.0.attn_gate.weight"):
        orkpy.load_model(variant("extra", add=[("blk.0.attn_gate.weight", np.ones((4, 64), np.float32))]))
    with pytest.raises(ValueError, match="attn_q has a bias in some blocks only"):
        orkpy.load_model(variant("somebias", add=[("blk.1.attn_q.bias", np.ones(64, np.float32))]))


def test_gemma1_strict_tensor_checks(tmp_path):
    """Gemma 1 (src/models/gemma.cpp): the head is token_embd (an output.weight is refused), no
    rope_freqs, no post / q-k norms; optional q/k/v biases (create_tensor_qkv) load."""
    p, T, c = _make(tmp_path, "gemma")
    assert "output.weight" not in T
    md = orkpy.formats.gguf_write.metadata_triples(str(p))

    def variant(name, add):
        q = tmp_path / f"{name}.gguf"
        write_gguf(q, md, list(T.items()) + list(add))
        return q

    for name, add in (("untied", [("output.weight", T["token_embd.weight"])]),
                      ("rope_freqs", [("rope_freqs.weight", np.ones(16, np.float32))]),
                      ("post", [(f"blk.{i}.post_ffw_norm.weight", np.ones(64, np.float32)) for i in range(3)]),
                      ("qnorm", [(f"blk.{i}.attn_q_norm.weight", np.ones(32, np.float32)) for i in range(3)])):
        with pytest.raises(ValueError, match="not used by architecture 'gemma'"):
            orkpy.load_model(variant(name, add))
    biased = variant("qkv_bias", [(f"blk.{i}.attn_{s}.bias", np.ones(n, np.float32))
                                  for i in range(3) for s, n in (("q", 128), ("k", 128), ("v", 128))])
    assert orkpy.load_model(biased).hparams["biases"] == ["attn_q", "attn_k", "attn_v"]


def test_core_checks_the_new_features(tmp_path):
    p, _, _ = _make(tmp_path, "qwen3")
    m = orkpy.load_model(p)
    hp = arch.core_hparams(m.hparams)
    src = open_source(p)
    base = orkpy.runtime.model._forward_model(m.hparams, src.tensor, m.linears)
    assert base.forward(archgen.tokens(8)).shape == (8, archgen.N_VOCAB)

    def build(**over):
        lay = []
        for i in range(hp["n_layer"]):
            d = {"attn_norm": src.tensor(f"blk.{i}.attn_norm.weight"), "ffn_norm": src.tensor(f"blk.{i}.ffn_norm.weight")}
            d.update({t: m.linears[f"blk.{i}.{t}.weight"].to_core() for t in orkpy.runtime.model.LINEARS})
            d.update(over.pop("layer", {}) if i == 0 else {})
            lay.append(d)
        h = dict(hp, **{k: v for k, v in over.items() if k not in ("rope_freqs", "output_bias")})
        return _core.ForwardModel(h, src.tensor("token_embd.weight"), src.tensor("output_norm.weight"),
                                  m.linears["output.weight"].to_core(), lay, output_bias=over.get("output_bias"),
                                  rope_freqs=over.get("rope_freqs"))

    build()
    for bad in (dict(attn_softcap=-1.0), dict(final_softcap=float("nan")), dict(embd_scale=-2.0), dict(gate_fn=7),
                dict(rope_freqs=np.ones(3, np.float32)), dict(rope_freqs=np.zeros(8, np.float32)),
                dict(output_bias=np.ones(5, np.float32)), dict(layer={"attn_q.bias": np.ones(3, np.float32)}),
                dict(layer={"post_attn_norm": np.ones(7, np.float32)}), dict(layer={"rope_base": -1.0})):
        with pytest.raises(ValueError):
            build(**bad)


def test_fused_chain_refuses_ffn_biases(tmp_path):
    p, _, _ = _make(tmp_path, "llama-biases-rope_freqs")
    m = orkpy.load_model(p, weights="int8")
    with pytest.raises(ValueError, match="biases"):
        m.set_ffn(0, {"mode": "fused", "lut_step": 0.1, "s_scale": 1.0, "u_scale": 1.0, "p_scale": 1.0})


def test_safetensors_qwen2_with_biases_and_other_architectures_refused(tmp_path):
    st_np = pytest.importorskip("safetensors.numpy")
    from orkpy.formats.source import _HF_NAMES, _HF_TOP

    p, T, c = _make(tmp_path, "qwen2")
    inv = {v: k for k, v in _HF_NAMES.items()}
    top = {v: k for k, v in _HF_TOP.items()}
    top["output.bias"] = "lm_head.bias"
    hf = {}
    for n, a in T.items():
        if n in top:
            hf[top[n]] = a
        else:
            _, i, stem, kind = n.split(".")
            hf[f"model.layers.{i}.{inv[stem]}.{kind}"] = a
    d = tmp_path / "hf"
    d.mkdir()
    st_np.save_file(hf, str(d / "model.safetensors"))
    tok = archgen.tokens(32)
    np.testing.assert_array_equal(orkpy.load_model(d, meta=p).forward(tok), orkpy.load_model(p).forward(tok))
    p3, _, _ = _make(tmp_path, "phi3")
    with pytest.raises(NotImplementedError, match="phi3"):
        orkpy.load_model(d, meta=p3)
