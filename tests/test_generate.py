"""The KV-cached decode session (csrc/ork/model.h) and generation (orkpy/runtime/generate.py).

- Session logits equal the batched forward pass's, bit for bit, for every position: a prompt
  prefilled as a batch (and in smaller steps) then one token at a time; on stories260K (F32,
  int8 and nf4 weights with per-token activations, int8 with static ranges and a prefix), on a
  saved quantized model directory, and on synthetic models of every architecture (sliding
  windows shorter than the sequence, soft-caps, q/k norms, biases); for 1 and 2 threads; SmolLM2
  F32 / int8 / nf4 on 1, 2 and 3 threads (slow), where the decode GEMVs are split over the threads.
- Greedy generation equals llama.cpp's greedy decode (tests/oracle.py oracle_greedy: KV-cached,
  float32 cache), token for token: stories260K (32 tokens) and SmolLM2-135M's float reference
  (slow), the chat template included.
- Sampling (seeded, reproducible), streaming (pieces join to the text), stopping at an
  end-of-generation id, chat templates and the special-token tokenization against
  llama-tokenize, errors (context overflow, bad sampling arguments), the CLI.
"""
import subprocess
import sys

import numpy as np
import pytest

import orkpy
from orkpy.runtime.generate import CHAT_TEMPLATES, apply_chat_template, chat_template_kind, prompt_tokens, sample_token
from orkpy.runtime.model import load_quantized

import archgen
from oracle import llama_eog_ids, llama_tokenize_special, oracle_greedy, real_model

ST = "models/stories260K/"
PROMPT = "Once upon a time, there was a little dog named"


@pytest.fixture(scope="module")
def stories(shared):
    return orkpy.load_model(shared / ST / "stories260K-F32.gguf")


@pytest.fixture(scope="module")
def text(shared):
    return (shared / "text" / "tinystories-val-B.txt").read_text(encoding="utf-8")[:4000]


def decode_rows(m, ids, k, threads=None, n_batch=512):
    """Logits of every position: ids[:k] prefilled as one eval (all rows), then one token at a time."""
    s = m.session(len(ids), n_batch=n_batch)
    rows = [s.eval(ids[:k], all_logits=True, threads=threads)]
    rows += [s.eval(ids[t:t + 1], threads=threads)[None] for t in range(k, len(ids))]
    assert s.pos == len(ids) and s.tokens == [int(i) for i in ids]
    return np.concatenate(rows)


# ------------------------------------------------------- bit for bit vs forward --
@pytest.mark.parametrize("weights", ["gguf", "int8", "nf4"])
def test_decode_equals_forward_bit_for_bit(shared, text, weights):
    m = orkpy.load_model(shared / ST / "stories260K-F32.gguf", weights=weights)
    ids = m.tokens(text)[:80]
    full = m.forward(ids, threads=2)
    for k in (1, 7):
        assert np.array_equal(decode_rows(m, ids, k, threads=2), full)
    assert np.array_equal(decode_rows(m, ids, 7, threads=1), full)      # thread count: no bit changes
    assert np.array_equal(decode_rows(m, ids, 30, n_batch=4), full)     # a prefill in steps of 4 tokens


def test_decode_static_activations_count_the_prefix_in_positions(shared, text):
    """act_prefix quantizes the first positions per token: a decode step at position p >= prefix
    must not treat its one row as a prefix row (the session passes absolute positions)."""
    m = orkpy.load_model(shared / ST / "stories260K-F32.gguf", weights="int8", act="static", calib=text,
                         calib_ctx=64, calib_chunks=1, act_prefix=3)
    assert m.linears["blk.0.attn_q.weight"].act_prefix == 3
    ids = m.tokens(text[2000:])[:40]
    full = m.forward(ids)
    for k in (1, 2, 5):
        assert np.array_equal(decode_rows(m, ids, k), full)


def test_per_tensor_scales_span_one_call(shared, text):
    """Dynamic per-tensor scales cover the rows of one call, so decoding (one row per call)
    differs from the batched pass -- documented in model.h; per-token equals it (above)."""
    m = orkpy.load_model(shared / ST / "stories260K-F32.gguf", weights="int8", act="per_tensor")
    ids = m.tokens(text)[:24]
    got = decode_rows(m, ids, 4)
    assert np.array_equal(got[:4], m.forward(ids[:4]))      # the prefill's scale: its 4 rows, as a 4-row pass
    assert not np.array_equal(got, m.forward(ids))


ARCHS = {
    "llama-biases": dict(arch="llama", qkv_bias=True, ffn_bias=True, rope_freqs=True),
    "qwen2-output-bias": dict(arch="qwen2", output_bias=True),
    "qwen3": dict(arch="qwen3", hd=24),
    "gemma": dict(arch="gemma", hd=32, HKV=4),
    "gemma2-window-softcaps": dict(arch="gemma2", n_swa=8, attn_softcap=5.0, final_softcap=3.0),
    "gemma3-pattern": dict(arch="gemma3", hd=32, HKV=1, n_layer=4, n_swa=6, rope_base=1e6, final_softcap=4.0),
    "gemma2-window-2": dict(arch="gemma2", n_swa=2),   # a window shorter than the 3 rows of a value-sum call
    "phi3": dict(arch="phi3", qkv_bias=True),
}


@pytest.mark.parametrize("case", sorted(ARCHS))
def test_decode_equals_forward_every_architecture(tmp_path, case):
    kw = dict(ARCHS[case])
    a = kw.pop("arch")
    p = tmp_path / f"{case}.gguf"
    archgen.make(a, p, n_ctx=160, **kw)
    m = orkpy.load_model(p)
    ids = archgen.tokens(150)
    full = m.forward(ids)
    # the windows (6, 8) are shorter than both the prefill and the sequence; 150 rows are three attention
    # blocks of the forward pass (64 query rows each), 70 two of the prefill
    for k in (1, 11, 70):
        assert np.array_equal(decode_rows(m, ids, k), full)


def test_saved_quantized_model_directory(shared, tmp_path, text):
    qm = orkpy.quantize_model(shared / ST / "stories260K-F16.gguf", shared / ST / "stories260K-Q4_0.gguf",
                              progress=False, log=lambda m: None)
    qm.save(tmp_path / "q")
    m = load_quantized(tmp_path / "q")
    assert {"int8", "nf4"} <= set(m.paths.values())
    ids = m.tokens(text)[:40]
    assert np.array_equal(decode_rows(m, ids, 5), m.forward(ids))
    want = m.generate(PROMPT, max_tokens=24, temperature=0)
    assert want == qm.to_model().generate(PROMPT, max_tokens=24, temperature=0) and len(want) > 20
    assert orkpy.load_model(tmp_path / "q").generate(PROMPT, max_tokens=24, temperature=0) == want


# --------------------------------------------------------------- the session --
def test_session_errors_leave_it_unchanged(stories):
    ids = stories.tokens(PROMPT)
    s = stories.session(len(ids) + 2)
    s.eval(ids)
    with pytest.raises(ValueError, match=rf"n_ctx {len(ids) + 2}"):
        s.eval([5, 6, 7])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        s.eval([5, 100000])
    assert s.pos == len(ids)
    a = s.eval([5, 6], all_logits=True)
    s.rewind(len(ids))
    assert np.array_equal(s.eval([5, 6], all_logits=True), a) and s.pos == s.n_ctx
    with pytest.raises(ValueError, match="cannot rewind to position"):
        s.rewind(s.pos + 1)
    with pytest.raises(ValueError, match="n_ctx must be an int >= 1"):
        stories.session(0)
    with pytest.raises(ValueError, match="non-empty"):
        s.eval([])
    s.rewind(0)
    assert s.pos == 0 and s.tokens == []


def test_session_context_limit_of_the_model(tmp_path):
    p = tmp_path / "phi3.gguf"
    archgen.make("phi3", p, longrope=(4096, 1.19))
    m = orkpy.load_model(p)
    with pytest.raises(ValueError, match="n_ctx 5000 is longer than the 4096 positions"):
        m.session(5000)
    m.session(4096)


# ------------------------------------------------------------------- sampling --
def test_greedy_is_the_argmax_loop_and_stream_joins_to_the_text(stories):
    ids = stories.tokens(PROMPT)
    s = stories.session(len(ids) + 40)
    lg, want = s.eval(ids), []
    for _ in range(40):
        want.append(int(np.argmax(lg)))
        lg = s.eval([want[-1]])
    st = {}
    text = stories.generate(PROMPT, max_tokens=40, temperature=0, stats=st)
    assert text == stories.tokenizer.decode(want, continuation=True) and text.startswith(" ")
    assert st["n_gen"] == 40 and st["stop"] == "max_tokens" and st["n_prompt"] == len(ids)
    pieces = list(stories.generate(PROMPT, max_tokens=40, temperature=0, stream=True))
    assert "".join(pieces) == text and len(pieces) > 20          # it streams: a piece per token or so
    assert stories.generate(ids, max_tokens=40, temperature=0) == text   # token ids as the prompt


def test_seeded_sampling_is_reproducible(stories):
    a = stories.generate(PROMPT, max_tokens=48, temperature=1.0, seed=7)
    assert a == stories.generate(PROMPT, max_tokens=48, temperature=1.0, seed=7)
    assert "".join(stories.generate(PROMPT, max_tokens=48, temperature=1.0, seed=7, stream=True)) == a
    others = {stories.generate(PROMPT, max_tokens=48, temperature=1.0, seed=s) for s in (8, 9, 10)}
    assert a not in others and len(others) > 1


def test_sampler_rules():
    rng = np.random.default_rng(0)
    lg = np.array([0.0, 3.0, 1.0, 3.0, 2.0, -1.0], np.float32)
    assert sample_token(lg, rng, 0.0) == 1                                        # greedy: the first largest
    assert {sample_token(lg, rng, 1.0, top_k=2) for _ in range(200)} == {1, 3}     # ties both kept
    assert {sample_token(lg, rng, 5.0, top_k=3) for _ in range(300)} == {1, 3, 4}
    # top_p on the temperature-1 distribution: p(1) = p(3) = 0.39, p(4) = 0.14, ...
    assert {sample_token(lg, rng, 1.0, top_k=0, top_p=0.7) for _ in range(300)} == {1, 3}
    assert {sample_token(lg, rng, 1.0, top_k=0, top_p=0.8) for _ in range(400)} == {1, 3, 4}
    counts = np.bincount([sample_token(lg, rng, 1.0, top_k=0, top_p=1.0) for _ in range(4000)], minlength=6)
    p = np.exp(lg - lg.max()) / np.exp(lg - lg.max()).sum()
    assert np.all(np.abs(counts / 4000 - p) < 0.03)                                # plain softmax sampling
    cold = [sample_token(lg, rng, 0.05, top_k=0) for _ in range(100)]
    assert set(cold) == {1, 3}                                                     # low temperature: the top ties


def test_stops_at_an_end_of_generation_id(stories):
    want = stories.generate(PROMPT, max_tokens=40, temperature=0)
    tok = stories.tokenizer
    dot = tok.encode(".", add_special=False)[-1]
    saved = tok.eog_ids
    tok.eog_ids = frozenset({dot})   # make "." end the generation
    try:
        st = {}
        got = stories.generate(PROMPT, max_tokens=40, temperature=0, stats=st)
    finally:
        tok.eog_ids = saved
    assert st["stop"] == "eog" and got == want[:want.index(".")] and "." not in got


@pytest.mark.parametrize("kw, msg", [
    (dict(temperature=-0.1), "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature="hot"), "temperature"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k must be an int >= 0"),
    (dict(max_tokens=-1), "max_tokens must be an int >= 0"),
    (dict(seed=-3), "seed must be an int >= 0"),
    (dict(n_ctx=8), r"need \d+ positions, more than n_ctx 8"),
])
def test_bad_arguments_raise_before_any_work(stories, kw, msg):
    with pytest.raises(ValueError, match=msg):
        stories.generate(PROMPT, **{"max_tokens": 16, **kw})
    with pytest.raises(ValueError, match=msg):
        stories.generate(PROMPT, stream=True, **{"max_tokens": 16, **kw})   # raised at the call, not at iteration


def test_zero_tokens_and_empty_prompt(stories):
    assert stories.generate(PROMPT, max_tokens=0) == "" and list(stories.generate(PROMPT, 0, stream=True)) == []
    assert len(stories.generate("", max_tokens=4, temperature=0)) > 0    # BOS alone is a prompt


# --------------------------------------------------------------------- chat --
def test_chat_templates_detected_and_written_as_llama_cpp():
    assert chat_template_kind("{{'<|im_start|>' + message['role']}}") == "chatml"
    assert chat_template_kind("{{ '<start_of_turn>' + role }}") == "gemma"
    assert chat_template_kind("<|start_header_id|>{{ role }}<|end_header_id|>") == "llama3"
    for bad in ("{{ '[INST]' }}", "<|im_start|><|im_sep|>"):
        with pytest.raises(ValueError, match="chat template"):
            chat_template_kind(bad)
    with pytest.raises(ValueError, match="no chat template"):
        chat_template_kind(None, "m.gguf")
    msgs = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": " Hi\n"}]
    assert apply_chat_template("chatml", msgs) == ("<|im_start|>system\n Be brief. <|im_end|>\n"
                                                   "<|im_start|>user\n Hi\n<|im_end|>\n<|im_start|>assistant\n")
    assert apply_chat_template("gemma", msgs) == ("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                                                  "<start_of_turn>model\n")
    assert apply_chat_template("llama3", msgs, add_generation_prompt=False) == (
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>")
    assert set(CHAT_TEMPLATES) == {"chatml", "gemma", "llama3"}


def test_chat_needs_a_template(stories):
    with pytest.raises(ValueError, match="stories260K-F32.gguf has no chat template"):
        stories.generate("Hi", chat=True)


@pytest.mark.parametrize("name, kind", [("smollm2", "chatml"), pytest.param("gemma3", "gemma", marks=pytest.mark.slow),
                                        ("stories", "chatml")])
def test_special_tokens_and_eog_ids_as_llama_cpp(shared, name, kind):
    path = shared / ST / "stories260K-F32.gguf" if name == "stories" else real_model(name)
    tok = orkpy.Tokenizer.from_gguf(path)
    text = apply_chat_template(kind, [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "What's 2+2? <b>x</b>  y\n"}])
    assert tok.encode(text, parse_special=True).tolist() == llama_tokenize_special(path, text)
    assert sorted(tok.eog_ids) == llama_eog_ids(path)
    if name != "stories":   # the control tokens are text without parse_special
        assert len(tok.encode(text)) > len(tok.encode(text, parse_special=True))


# ------------------------------------------------------------------ llama.cpp --
def test_greedy_equals_llama_cpp_stories260k(shared, stories):
    path = shared / ST / "stories260K-F32.gguf"
    for prompt in (PROMPT, "Tom had a red ball. He"):
        ids = stories.tokens(prompt)
        ref = oracle_greedy(path, ids, 32)
        s = stories.session(len(ids) + 32)
        lg, got = s.eval(ids), []
        while len(got) < 32:
            got.append(int(np.argmax(lg)))
            lg = s.eval(got[-1:])
        assert len(ref) == 32 and got == ref.tolist()
        assert stories.generate(ids, 32, temperature=0) == stories.tokenizer.decode(ref, continuation=True)


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["gguf", "int8", "nf4"])
def test_decode_split_over_threads_smollm2(weights):
    """SmolLM2's decode GEMVs (q / o 576 x 576 up to the 49152-row head; k / v stay on one thread) are
    split over the threads (pack.c run_strips; the F32 GEMV, gemm_f32.h M = 1): a token's logits are
    the same bits on 1, 2 and 3 threads and equal the forward pass's."""
    from realmodels import f32_reference
    m = orkpy.load_model(f32_reference("smollm2"), weights=weights)
    ids = m.tokens(PROMPT)[:12]
    full = m.forward(ids, threads=1)
    for t in (1, 2, 3):
        assert np.array_equal(decode_rows(m, ids, 4, threads=t), full), t


@pytest.mark.slow
def test_greedy_equals_llama_cpp_smollm2(tmp_path):
    from realmodels import f32_reference
    path = f32_reference("smollm2")       # the float reference: both sides run float32 weights
    m = orkpy.load_model(path)
    for prompt, chat in ((PROMPT, False), ("What is the capital of France? Answer in one sentence.", True),
                         ("Write three short lines about the sea.", True)):
        ids = prompt_tokens(m, prompt, chat)
        ref = oracle_greedy(path, ids, 32)
        st = {}
        got = m.generate(prompt, 32, temperature=0, chat=chat, stats=st)
        assert got == m.tokenizer.decode(ref, continuation=True), (prompt, got)
        assert st["n_gen"] == len(ref) and (st["stop"] == "eog") == (len(ref) < 32)


# ----------------------------------------------------------------------- CLI --
def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "orkpy", "generate", *map(str, args)], capture_output=True, text=True)


def test_cli_generate(shared, stories):
    path = shared / ST / "stories260K-F32.gguf"
    r = run_cli(path, "-p", PROMPT, "-n", 24, "--temp", 0, "-t", 1)
    assert r.returncode == 0, r.stderr
    assert r.stdout == stories.generate(PROMPT, 24, temperature=0) + "\n"
    assert "tokens/s" in r.stderr
    r = run_cli("-m", path, "-p", PROMPT, "-n", 24, "--seed", 5, "--top-k", 10, "--top-p", 0.9, "--temp", 0.7)
    assert r.returncode == 0 and r.stdout == stories.generate(PROMPT, 24, 0.7, 10, 0.9, seed=5) + "\n"
    r = run_cli(path, "-p", PROMPT, "--temp", -1)
    assert r.returncode == 2 and "--temp" in r.stderr
    r = run_cli(path, "-p", "Hi", "--chat")
    assert r.returncode == 1 and "no chat template" in r.stderr
    r = run_cli(path)
    assert r.returncode == 2 and "-p" in r.stderr
