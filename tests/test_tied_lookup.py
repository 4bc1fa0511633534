"""quantize_model(tied_lookup="packed"): a tied model's embedding lookup reads the packed head's
rows, so the saved model stores the table once (csrc/ork/model.h tok_embd NULL, ork_linear_row)."""
import os

import numpy as np
import pytest

import orkpy
from orkpy.runtime.model import Model
from orkpy.formats.tiermap import EMBEDDING

SKEL = "models/qwen3-skeleton/qwen3-skel-tied-F16.gguf"
ALLOC = "models/qwen3-skeleton/qwen3-skel-tied-Q4_K_M.gguf"


def dir_bytes(p):
    return sum(os.path.getsize(os.path.join(p, f)) for f in os.listdir(p))


@pytest.mark.parametrize("group", [None, 64])
def test_packed_lookup_is_the_dequantized_head_and_is_stored_once(shared, tmp_path, group):
    f16, alloc = shared / SKEL, shared / ALLOC
    quiet = dict(progress=False, log=lambda s: None, group_size=group)
    flt = orkpy.quantize_model(f16, alloc, **quiet)
    pk = orkpy.quantize_model(f16, alloc, tied_lookup="packed", **quiet)
    assert "tied_lookup" not in flt.settings and pk.settings["tied_lookup"] == "packed"
    toks = np.arange(1, 80, dtype=np.int32) % 2048
    got = pk.to_model().forward(toks)
    # the reference: the float lookup with the table replaced by the packed head, dequantized
    src, m = pk._src, flt.to_model()
    head = pk.tensors["output.weight"].dequantize()
    ref = Model(pk.source, src.hp, m.linears, lambda n: head if n == EMBEDDING else src.tensor(n), src.meta,
                src.tied, dict(m.paths))
    assert np.array_equal(got, ref.forward(toks))
    assert not np.array_equal(got, m.forward(toks))
    a, b = flt.save(tmp_path / "float"), pk.save(tmp_path / "packed")
    emb = int(np.prod(src.shapes()[EMBEDDING])) * 2  # the F16 table
    assert dir_bytes(a) - dir_bytes(b) >= emb * 0.99
    back = orkpy.load_model(b)
    assert back.n_vocab == 2048 and np.array_equal(back.forward(toks), got)
    with orkpy.GGUFFile(os.path.join(b, "float.gguf")) as g:
        assert EMBEDDING not in g
    assert np.array_equal(orkpy.load_model(a).forward(toks), m.forward(toks))


def test_tied_lookup_argument(shared):
    with pytest.raises(ValueError, match="tied_lookup"):
        orkpy.quantize_model(shared / SKEL, shared / ALLOC, tied_lookup="int8", progress=False)
    # an untied model: nothing to read from the head; the setting is not recorded
    st = shared / "models/stories260K/stories260K-F32.gguf"
    qm = orkpy.quantize_model(st, shared / "models/stories260K/stories260K-Q4_0.gguf", tied_lookup="packed",
                              progress=False, log=lambda s: None)
    assert "tied_lookup" not in qm.settings
