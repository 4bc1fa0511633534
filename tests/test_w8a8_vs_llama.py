"""The issue-16 goal as a gate, against the live llama.cpp: on SmolLM2-135M (its exact F32
reference), w8a8 with the Hadamard rotation (folded in, plus the online one before ffn_down),
GPTQ-rounded int8 weights and per-token int8 activations is at least as close to the float model
(mean KL) as llama.cpp's Q8_0 of the same F32 file, scored by llama-perplexity's KL mode on the
same text and chunks; and the rotation is what gets there (plain rounding, no rotation: far worse).

Wikitext-2 test, 3 chunks of 512 scored; TinyStories, 4 chunks of 512, calibrates (GPTQ's Gram
matrices and nothing else). Measured on 8 chunks (bench/act_modes.py): orkpy 0.0033, llama.cpp
Q8_0 0.0040, unrotated RTN 0.0349."""
import pytest

import orkpy
from oracle import llama_kld, llama_quantize
from realmodels import f32_reference, work_dir

pytestmark = [pytest.mark.slow, pytest.mark.gate]

CTX, CHUNKS, CALIB_CHUNKS = 512, 3, 4


def test_rotated_gptq_w8a8_at_least_as_close_as_llama_q8_0(shared, tmp_path):
    f32 = f32_reference("smollm2")
    wiki = shared / "text" / "wikitext-2-raw-test.txt"
    calib = (shared / "text" / "tinystories-val-B.txt").read_text(encoding="utf-8")
    # llama.cpp: Q8_0 of the same F32 file, KL against its own F32 run
    q8 = llama_quantize(f32, work_dir() / "smollm2-Q8_0.gguf", "Q8_0")
    base = tmp_path / "llama-f32.kld"
    llama_kld(f32, base, text=wiki, n_ctx=CTX, chunks=CHUNKS)
    llama_q8 = llama_kld(q8, base)
    # orkpy: F32 log-probs, then the quantized models scored against them
    ref = orkpy.load_model(f32)
    tokens = ref.tokens(wiki.read_text(encoding="utf-8"))
    lp = str(tmp_path / "orkpy-f32.npz")
    orkpy.perplexity(ref, tokens, n_ctx=CTX, chunks=CHUNKS, save_logprobs=lp, progress=False)
    del ref

    def kl(model):
        return orkpy.perplexity(model, tokens, n_ctx=CTX, chunks=CHUNKS, kld_base=lp, progress=False).kld["mean"]

    qm = orkpy.quantize_model(f32, f32, method="gptq", rotate="hadamard", rotate_online=True, calib=calib,
                              calib_ctx=CTX, calib_chunks=CALIB_CHUNKS, progress=False, log=lambda s: None)
    out = qm.save(tmp_path / "w8a8-rot-gptq")
    del qm
    ours = kl(orkpy.load_model(out, act="per_token"))
    plain = kl(orkpy.load_model(f32, weights="int8", act="per_token"))
    print(f"mean KL vs F32: orkpy rotated+GPTQ w8a8 {ours:.5f}, llama.cpp Q8_0 {llama_q8['kld']:.5f}, "
          f"orkpy unrotated RTN w8a8 {plain:.5f}")
    assert ours <= llama_q8["kld"]
    assert 5 * ours < plain
