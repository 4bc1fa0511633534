"""Gates for the product's claims on stories260K (n_ctx 256, the first 100
chunks of tinystories-val-B; imatrix from the first 200 chunks of the same
text). Margins are the ones measured (see the printed table); a claim that
does not hold is reported, not silently weakened. Marker: gate."""
import math

import pytest

from orkpy.cli import read_text_like_llama_cpp
from orkpy.evaluation.table import format_table, ppl_table

pytestmark = pytest.mark.gate


@pytest.fixture(scope="module")
def table(shared):
    text = read_text_like_llama_cpp(shared / "text" / "tinystories-val-B.txt")
    rows = ppl_table(shared / "models" / "stories260K", text, chunks=100, calib_chunks=200)
    print("\n" + format_table(rows))
    return {(r.config, r.alloc): r for r in rows}


def row(table, config, alloc="Q4_0"):
    return table[(config, alloc)]


def test_fp16_source_beats_double_quant(table):
    ours = row(table, "ours: fp16 + alloc + imatrix + NF4")
    dq = row(table, "double-quant (re-quantized GGUF bytes)")
    assert ours.ppl < dq.ppl and ours.kld < dq.kld


def test_imatrix_does_not_hurt(table):
    for alloc in ("Q4_0", "Q4_K_M"):
        w = row(table, "ours: fp16 + alloc + imatrix + NF4", alloc)
        wo = row(table, "ours without imatrix", alloc)
        assert w.kld <= wo.kld * 1.02, alloc


def test_nf4_beats_uniform_int4(table):
    nf4 = row(table, "ours: fp16 + alloc + imatrix + NF4")
    int4 = row(table, "uniform int4 instead of NF4")
    assert nf4.ppl < int4.ppl and nf4.kld < int4.kld


def test_all_int8_close_to_f32(table):
    r = table[("all-int8 w8a8", "-")]
    f32 = table[("F32 (reference)", "-")]
    assert abs(r.ppl / f32.ppl - 1) < 0.01 and r.kld < 0.01


def test_q4_k_m_allocation_reads_the_intended_types_on_this_model(table, shared):
    # stories260K's rows of 64 make llama.cpp's Q4_K_M fall back to 5- and 8-bit types: read literally (the
    # seed's rule) everything is int8 at threshold 5; read through the fallbacks (issue 19, the default) the
    # intended Q4_K tensors are int4
    import orkpy
    q4km = shared / "models" / "stories260K" / "stories260K-Q4_K_M.gguf"
    with pytest.warns(UserWarning, match="fallback types"):
        assert orkpy.tier_map(q4km, fallback="literal").int8_share() == 1.0
    assert 0 < row(table, "ours: fp16 + alloc + imatrix + NF4", "Q4_K_M").int8_share < 1
    assert 0 < row(table, "ours: fp16 + alloc + imatrix + NF4", "Q4_0").int8_share < 1
    assert all(math.isfinite(r.ppl) for r in table.values())
