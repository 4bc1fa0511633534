"""Tier map: a llama.cpp mixed GGUF as allocation oracle."""
import collections

import pytest

import orkpy
from orkpy.cli import main
from orkpy.formats.tiermap import TierEntry, type_tier

QWEN_LAYERS_MORE_BITS = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27}  # ../shared/README.md


def llama_cpp_use_more_bits(i, n):
    """llama.cpp's Q4_K_M rule for attn_v / ffn_down (src/llama-quant.cpp, use_more_bits), integer division."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


@pytest.fixture
def qwen(shared):
    return shared / "models" / "qwen3-skeleton"


def test_qwen3_q4km_counts_equal_the_file(qwen):
    p = qwen / "qwen3-skel-tied-Q4_K_M.gguf"
    tm = orkpy.tier_map(p)
    with orkpy.GGUFFile(p) as g:
        assert tm.counts_by_type() == dict(collections.Counter(t.type for t in g.tensors))
    assert tm.counts_by_type() == {"Q4_K": 168, "Q6_K": 29, "F32": 113}
    assert tm.counts_by_tier() == {"int8": 29, "int6": 0, "int5": 0, "int4": 168, "w4a8": 0, "w4a4": 0, "float": 113}
    assert tm.tied


def test_qwen3_q4km_int8_pattern_matches_llama_cpp(qwen):
    tm = orkpy.tier_map(qwen / "qwen3-skel-tied-Q4_K_M.gguf")
    int8 = set(tm.names("int8"))
    expected = {f"blk.{i}.{w}.weight" for i in QWEN_LAYERS_MORE_BITS for w in ("attn_v", "ffn_down")}
    assert int8 == expected | {"token_embd.weight"}
    assert {i for i in range(28) if llama_cpp_use_more_bits(i, 28)} == QWEN_LAYERS_MORE_BITS
    per_layer = collections.defaultdict(set)
    for name in int8 - {"token_embd.weight"}:
        _, layer, w, _ = name.split(".")
        per_layer[int(layer)].add(w)
    assert all(v == {"attn_v", "ffn_down"} for v in per_layer.values())
    # every other 2-D weight of every layer is int4, every 1-D tensor float
    for name, tier in tm.items():
        if name in int8:
            continue
        assert tier == ("float" if name.endswith("norm.weight") else "int4"), name


def test_untied_head_is_its_own_tensor(qwen):
    tm = orkpy.tier_map(qwen / "qwen3-skel-untied-Q4_K_M.gguf")
    assert not tm.tied
    assert tm["output.weight"] == "int8" and tm.entries["output.weight"].ggml_type == "Q6_K"
    assert tm["token_embd.weight"] == "int4"
    assert orkpy.tier_map(qwen / "qwen3-skel-untied-Q4_K_M.gguf", output="int4")["output.weight"] == "int4"


def test_embeddings_and_output_parameters(qwen):
    p = qwen / "qwen3-skel-tied-Q4_K_M.gguf"
    assert orkpy.tier_map(p, embeddings="float")["token_embd.weight"] == "float"
    assert orkpy.tier_map(p, embeddings="int4")["token_embd.weight"] == "int4"
    with pytest.raises(ValueError, match="embeddings/output"):
        orkpy.tier_map(p, embeddings="fp8")


def test_threshold_moves_types_between_tiers(qwen):
    p = qwen / "qwen3-skel-tied-Q4_K_M.gguf"
    assert orkpy.tier_map(p, threshold=7.0).counts_by_tier()["int8"] == 0      # Q6_K is 6.5625 bpw
    assert orkpy.tier_map(p, threshold=4.0).counts_by_tier()["int4"] == 0      # Q4_K is 4.5 bpw
    with pytest.raises(ValueError, match="threshold"):
        orkpy.tier_map(p, threshold=-1)


def test_type_tier_rule_at_the_boundaries():
    assert type_tier("Q4_1") == "int8"   # exactly 5.0 bpw: ">= threshold" -> int8
    assert type_tier("Q4_0") == type_tier("Q4_K") == type_tier("IQ4_NL") == type_tier("IQ4_XS") == "int4"
    assert type_tier("Q5_0") == type_tier("Q5_K") == type_tier("Q6_K") == type_tier("Q8_0") == "int8"
    assert type_tier("F32") == type_tier("F16") == type_tier("BF16") == "int8"
    assert type_tier("F16", threshold=20) == "int8"  # float sources always count as int8
    with pytest.raises(KeyError):
        type_tier("Q9_9")


def test_fp16_source_and_mixed_q4_0(shared):
    st = shared / "models" / "stories260K"
    tm = orkpy.tier_map(st / "stories260K-F16.gguf")
    assert tm.counts_by_tier()["int4"] == 0 and tm.counts_by_tier()["int8"] > 0
    tm = orkpy.tier_map(st / "stories260K-Q4_0.gguf")
    int8 = set(tm.names("int8"))
    assert int8 and all(n.endswith("ffn_down.weight") for n in int8)   # F16 (rows of 172)
    assert all(tm[n] == "int4" for n in tm if n.endswith(("attn_q.weight", "ffn_up.weight")))


def test_int8_share_by_result_bytes():
    tm = orkpy.TierMap({"a": TierEntry("int8", "Q6_K", (10, 64)), "b": TierEntry("int4", "Q4_K", (10, 64)),
                        "n": TierEntry("float", "F32", (64,))})
    a, b = 32 * 64 + 40, 32 * 32 + 40          # packed storage: rows padded to the 32-row tile, scales
    assert tm.result_bytes() == {"int8": a, "int6": 0, "int5": 0, "int4": b, "w4a8": 0, "w4a4": 0}
    assert tm.int8_share() == pytest.approx(a / (a + b))


def test_int6_int5_tiers_count_their_bits():
    tm = orkpy.TierMap({"a": TierEntry("int6", "Q6_K", (10, 64)), "b": TierEntry("int5-g32", "Q5_K", (10, 64)),
                        "c": TierEntry("int8", "Q8_0", (10, 64))})
    a, b, c = 32 * 64 * 6 // 8 + 40, 32 * 64 * 5 // 8 + 2 * 10 * 2, 32 * 64 + 40  # 6 / 5 bits per code; f16 groups
    assert tm.result_bytes() == {"int8": c, "int6": a, "int5": b, "int4": 0, "w4a8": 0, "w4a4": 0}
    assert orkpy.formats.tiermap.packed_nbytes("int5-g32", 10, 64) == b
    assert tm.counts_by_tier() == {"int8": 1, "int6": 1, "int5": 1, "int4": 0, "w4a8": 0, "w4a4": 0, "float": 0}
    assert tm.int8_share() == pytest.approx(c / (a + b + c))
    with pytest.raises(ValueError, match="unknown tier"):
        orkpy.formats.tiermap.split_tier("int7")


def test_emit_map_round_trip_and_atomic(qwen, tmp_path):
    tm = orkpy.tier_map(qwen / "qwen3-skel-tied-Q4_K_M.gguf")
    out = tmp_path / "map.txt"
    tm.save(out)
    assert [p.name for p in tmp_path.iterdir()] == ["map.txt"]  # no temp file left
    back = orkpy.TierMap.load(out)
    assert back == tm and back.tied and back.source == "qwen3-skel-tied-Q4_K_M.gguf"
    text = out.read_text()
    assert text.startswith("# orkpy tier map v2\n")
    assert "blk.0.attn_v.weight\tint8\tQ6_K\t128x256\n" in text


@pytest.mark.parametrize("body, match", [
    ("not a map\n", r":1: not an orkpy tier map"),
    ("# orkpy tier map v1\na\tint8\tQ4_K\n", r":2: expected 4 tab-separated fields, got 3"),
    ("# orkpy tier map v1\na\tint9\tQ4_K\t2x32\n", r":2: unknown tier 'int9'"),
    ("# orkpy tier map v1\na\tint8\tQ4_Z\t2x32\n", r":2: unknown ggml type 'Q4_Z'"),
    ("# orkpy tier map v1\na\tint8\tQ4_K\t2xq\n", r":2: bad shape '2xq'"),
    ("# orkpy tier map v1\na\tint8\tQ4_K\t0x32\n", r":2: bad shape '0x32'"),
    ("# orkpy tier map v1\na\tint8\tQ4_K\t2x32\na\tint4\tQ4_K\t2x32\n", r":3: duplicate tensor 'a'"),
    ("# orkpy tier map v1\n\tint8\tQ4_K\t2x32\n", r":2: empty tensor name"),
    ("# orkpy tier map v1\n# threshold: five\n", r"bad threshold"),
    ("# orkpy tier map v1\n# tied: maybe\n", r"bad 'tied' value"),
])
def test_emit_map_bad_files(tmp_path, body, match):
    p = tmp_path / "m.txt"
    p.write_text(body)
    with pytest.raises(orkpy.FormatError, match=match):
        orkpy.TierMap.load(p)


def test_emit_map_not_utf8(tmp_path):
    p = tmp_path / "m.txt"
    p.write_bytes(b"# orkpy tier map v1\n\xff\xfe\n")
    with pytest.raises(orkpy.FormatError, match="not UTF-8"):
        orkpy.TierMap.load(p)


def test_cli_tier_map_and_gguf_info(qwen, tmp_path, capsys):
    out = tmp_path / "m.txt"
    assert main(["tier-map", str(qwen / "qwen3-skel-tied-Q4_K_M.gguf"), "--emit-map", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Q6_K      int8         29" in text and "Q4_K      int4        168" in text
    assert "int8 share of weight storage: 28.0%" in text and out.exists()
    assert main(["gguf-info", str(qwen / "qwen3-skel-tied-Q4_K_M.gguf")]) == 0
    text = capsys.readouterr().out
    assert "qwen3.block_count" in text and "list[2048]" in text and "blk.27.ffn_down.weight" in text
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x01\0\0\0")
    assert main(["gguf-info", str(bad)]) == 1
    assert "obsolete" in capsys.readouterr().err
