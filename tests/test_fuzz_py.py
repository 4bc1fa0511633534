"""The Python parsers' fuzz targets (tests/fuzz/pytargets.py): every stored corpus
input and every run-time seed (made from the real files in ../shared) replayed
in this process, a short fuzzing run of each target through tests/fuzz/run.py
(atheris when installed, else pyfuzz.py's built-in mutator), and one
regression test per bug the fuzzers found. Longer runs: tests/fuzz/run.py."""
import json
import os
import pathlib
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

import orkpy
from orkpy import FormatError
from orkpy.quantization.imatrix import ImatrixError

FUZZ = pathlib.Path(__file__).resolve().parent / "fuzz"
sys.path.insert(0, str(FUZZ))
try:
    import pytargets
finally:
    sys.path.remove(str(FUZZ))

NAMES = sorted(pytargets.TARGETS)
SECONDS = 3


@pytest.fixture(scope="module", autouse=True)
def _scratch_cleanup():
    yield
    pytargets.cleanup()


@pytest.mark.parametrize("name", NAMES)
def test_stored_corpus_and_seeds_replay(name):
    t = pytargets.TARGETS[name]
    stored = pytargets.corpus_files(name)
    assert stored, f"tests/fuzz/corpus/{name}/ is empty"
    assert sum(p.stat().st_size for p in stored) < 20_000  # small: a few KB per target
    seeds = t.seeds(pytargets.SHARED.is_dir())
    assert seeds
    for p in stored:
        t(p.read_bytes())
    for data in seeds.values():
        t(data)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_short_fuzz_run(name, tmp_path):
    r = subprocess.run([sys.executable, str(FUZZ / "run.py"), name, "--seconds", str(SECONDS), "--seed", "1",
                        "--keep", str(tmp_path)], capture_output=True, text=True, timeout=SECONDS + 300)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr[-4000:]}"
    m = re.search(rf"^{name}\s+py\s+executions\s+(\d+) .*crashes/hangs/leaks 0  ok$", r.stdout, re.M)
    assert m, r.stdout
    assert not list((tmp_path / name / "artifacts").iterdir())


def test_builtin_engine_counts_runs_and_writes_no_artifact(tmp_path):
    """The fallback engine (no atheris): a fixed number of executions, deterministic per seed."""
    corpus = tmp_path / "corpus"
    pytargets.write_seeds("tiermap", corpus, shared=False)
    r = subprocess.run([sys.executable, str(FUZZ / "pyfuzz.py"), "tiermap", str(corpus), "--engine=builtin",
                        "-runs=300", "-seed=7", "-print_final_stats=1", f"-artifact_prefix={tmp_path}/"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, ORKPY_FUZZ_SCRATCH=str(tmp_path / "scratch")))
    assert r.returncode == 0, r.stderr
    assert "stat::number_of_executed_units: 300" in r.stderr
    assert not list(tmp_path.glob("crash-*"))


def test_builtin_engine_reports_an_escaping_exception(tmp_path):
    """A crashing input: exit 1, the input written as crash-<sha1>, the traceback printed."""
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00")
    probe = ("import sys, pytargets, pyfuzz\n"
             "t = pytargets.TARGETS['safetensors']\n"
             "def boom(data):\n    raise KeyError('planted')\n"
             "t.fn = boom\n"
             "sys.exit(pyfuzz.run_builtin(t, {'artifact_prefix': sys.argv[1]}, [sys.argv[2]]))\n")
    r = subprocess.run([sys.executable, "-c", probe, f"{tmp_path}/", str(bad)], capture_output=True, text=True,
                       cwd=FUZZ, timeout=120, env=dict(os.environ, PYTHONPATH=str(FUZZ)))
    assert r.returncode == 1 and "KeyError: 'planted'" in r.stderr, r.stderr
    assert len(list(tmp_path.glob("crash-*"))) == 1


def test_a_unicode_error_is_a_finding_not_a_validation():
    t = pytargets.Target("probe", None, lambda: (ValueError,), lambda shared: {}, "probe")
    t.fn = lambda data: (_ for _ in ()).throw(ValueError("documented"))
    t(b"")   # the documented class: fine
    t.fn = lambda data: b"\xff".decode("utf-8")
    with pytest.raises(UnicodeDecodeError):   # a ValueError by inheritance, still a bug
        t(b"")
    t.fn = lambda data: {}["x"]
    with pytest.raises(KeyError):
        t(b"")


def test_tokenizer_vocab_codec_round_trips():
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": ["a", "\udcff", "x" * 300],
            "tokenizer.ggml.merges": ["a a"], "tokenizer.ggml.token_type": np.array([1, 3, 6], np.int32),
            "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.eos_token_id": 2}
    data = pytargets.encode_vocab(meta, "text")
    triples, text = pytargets.decode_vocab(data)
    got = {k: v for k, _, v in triples}
    assert text == "text" and got["tokenizer.ggml.tokens"] == meta["tokenizer.ggml.tokens"]
    assert got["tokenizer.ggml.merges"] == ["a a"] and got["tokenizer.ggml.eos_token_id"] == 2
    assert pytargets.encode_vocab(got, text) == data
    for n in range(0, len(data), 7):   # any prefix decodes
        pytargets.decode_vocab(data[:n])


# ------------------------------------------------------ regressions (found by fuzzing) --

def test_imatrix_gguf_count_beyond_u64_is_a_format_error(tmp_path):
    """fuzz imatrix_gguf: a counts value of 1e20 loaded, then Imatrix.sha256() raised struct.error."""
    p = tmp_path / "big.gguf"
    orkpy.write_gguf(p, [("general.type", "STRING", "imatrix"), ("imatrix.datasets", "ARRAY", ["x"]),
                         ("imatrix.chunk_count", "UINT32", 1), ("imatrix.chunk_size", "UINT32", 512)],
                     [("w.in_sum2", np.ones(4, np.float32)), ("w.counts", np.array([1e20], np.float32))])
    with pytest.raises(ImatrixError, match="token count"):
        orkpy.Imatrix.load(p)
    q = tmp_path / "ok.gguf"   # the largest exact float32 below 2**64 still loads and hashes
    orkpy.write_gguf(q, [("general.type", "STRING", "imatrix"), ("imatrix.datasets", "ARRAY", ["x"]),
                         ("imatrix.chunk_count", "UINT32", 1), ("imatrix.chunk_size", "UINT32", 512)],
                     [("w.in_sum2", np.ones(4, np.float32)),
                      ("w.counts", np.array([np.nextafter(np.float32(2.0**64), np.float32(0))], np.float32))])
    assert len(orkpy.Imatrix.load(q).sha256()) == 64


@pytest.fixture(scope="module")
def model_dir():
    d = pytargets._model_dir()
    good = pathlib.Path(d, "manifest.json").read_bytes()
    yield pathlib.Path(d), good
    pathlib.Path(d, "manifest.json").unlink(missing_ok=True)
    pathlib.Path(d, "manifest.json").write_bytes(good)


def _manifest_cases(good):
    m = json.loads(good)
    cases = {}
    e = json.loads(good)
    del e["tensors"]["blk.0.attn_q.weight"]["kind"]
    cases["entry without kind (was KeyError)"] = e
    e = json.loads(good)
    e["tensors"]["blk.0.attn_q.weight"] = ["not", "an", "object"]
    cases["entry not an object"] = e
    e = json.loads(good)
    e["tensors"]["blk.0.attn_q.weight"]["shape"] = 7
    cases["shape not a list (was TypeError)"] = e
    e = json.loads(good)
    e["float_file"] = "float.gguf"
    cases["float_file not an object"] = e
    e = dict(m, version=True)
    cases["version true (was accepted as 1)"] = e
    raw = {k: json.dumps(v).encode() for k, v in cases.items()}
    raw["nested 100000 deep (was RecursionError)"] = (b'{"format":"orkpy-quantized-model","version":1,"x":'
                                                       + b"[" * 100000 + b"]" * 100000 + b"}")
    raw["5000-digit integer (was ValueError)"] = b'{"format":"orkpy-quantized-model","version":1' + b"0" * 5000 + b"}"
    return raw


def test_manifest_errors_are_format_errors(model_dir):
    """fuzz manifest: a missing or mistyped field, deep nesting or a huge integer literal
    escaped as KeyError / TypeError / RecursionError / ValueError, and version true passed."""
    from orkpy.quantization.calibrate import load_quantized
    d, good = model_dir
    for what, data in _manifest_cases(good).items():
        (d / "manifest.json").unlink()
        (d / "manifest.json").write_bytes(data)
        with pytest.raises(FormatError) as ei:
            load_quantized(d)
        assert type(ei.value) is FormatError, (what, ei.value)
    (d / "manifest.json").unlink()
    (d / "manifest.json").mkdir()     # a directory named manifest.json (was IsADirectoryError)
    try:
        with pytest.raises(FormatError):
            load_quantized(d)
    finally:
        (d / "manifest.json").rmdir()
        (d / "manifest.json").write_bytes(good)
    assert load_quantized(d).manifest == json.loads(good)


def test_safetensors_bf16_scalar_is_a_read_only_array(tmp_path):
    """fuzz safetensors: a 0-d BF16 tensor came back as a writable numpy scalar, not an array."""
    p = tmp_path / "s.safetensors"
    p.write_bytes(pytargets.st_bytes({"s": np.array(0x3F80, np.uint16)}))   # BF16 1.0
    a = orkpy.load_safetensors(p)["s"]
    assert isinstance(a, np.ndarray) and a.shape == () and a.dtype == np.float32 and float(a) == 1.0
    assert not a.flags.writeable


def test_st_bytes_matches_the_official_writer(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    t = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, 0], np.int8)}
    p = tmp_path / "a.safetensors"
    p.write_bytes(pytargets.st_bytes(t))
    back = st.load_file(str(p))
    assert all(np.array_equal(back[k], v) for k, v in t.items())
    assert struct.unpack("<Q", p.read_bytes()[:8])[0] % 8 == 0


def test_tokenizer_pieces_with_invalid_utf8_keep_their_bytes(tmp_path):
    """fuzz tokenizer: a GGUF token whose bytes are not UTF-8 (decoded with surrogateescape by
    the reader) made decode / token_to_piece raise UnicodeEncodeError, and a user-defined one
    made from_gguf refuse the vocabulary."""
    from orkpy.runtime.tokenizer import Tokenizer
    toks = ["<unk>", "<s>", "</s>", "a\udcff", "\udcc3", "<u\udcfe>", "b"]
    p = tmp_path / "v.gguf"
    orkpy.write_gguf(p, [("tokenizer.ggml.model", "STRING", "llama"), ("tokenizer.ggml.tokens", "ARRAY", toks),
                         ("tokenizer.ggml.token_type", "ARRAY", np.array([2, 3, 3, 1, 3, 4, 1], np.int32))], [])
    tok = Tokenizer.from_gguf(p)
    assert tok.token_to_piece(3) == b"a\xff" and tok.token_to_piece(4, special=True) == b"\xc3"
    assert tok.token_to_piece(5) == b"<u\xfe>"
    assert tok.decode([3, 6]) == "a\ufffdb" and tok.decode([4, 6], special=True) == "\ufffdb"


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1.5, 2.0, "1", True])
def test_tokenizer_special_id_of_the_wrong_type_is_a_value_error(tmp_path, value):
    """fuzz tokenizer: tokenizer.ggml.bos_token_id stored as FLOAT32 inf escaped as OverflowError;
    1.5 was truncated to 1 and used. llama.cpp requires an integer key; so does orkpy."""
    from orkpy.runtime.tokenizer import Tokenizer
    tname = {float: "FLOAT32", str: "STRING", bool: "BOOL"}[type(value)]
    p = tmp_path / "v.gguf"
    orkpy.write_gguf(p, [("tokenizer.ggml.model", "STRING", "llama"),
                         ("tokenizer.ggml.tokens", "ARRAY", ["<unk>", "<s>", "</s>", "a"]),
                         ("tokenizer.ggml.bos_token_id", tname, value)], [])
    with pytest.raises(ValueError, match="bos_token_id.*not an integer") as ei:
        Tokenizer.from_gguf(p)
    assert type(ei.value) is ValueError


@pytest.mark.parametrize("header", [
    b"{'descr': '<f8', 'fortran_order': False, 'shape': (3,\n",      # NumPy's parser: tokenize.TokenError
    b"{'descr': '<f1', 'fortran_order': False, 'shape': (1,), }\n",  # NumPy: TypeError, no such type
    b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }\n",
    b"{'descr': '<f8', 'fortran_order': False, 'shape': (1), }\n",    # not a tuple
    b"{'descr': '<f8', 'fortran_order': False, 'shape': (" + b"9" * 30 + b",), }\n",
])
def test_kl_ref_npy_header_is_a_format_error(tmp_path, header):
    """fuzz kl_ref: a damaged .npy header inside the KL reference escaped from NumPy's header parser as
    tokenize.TokenError, and a '<f1' dtype as TypeError; the reader now parses the header itself."""
    from orkpy.evaluation.ppl import _Reference
    npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(8)
    data = pytargets.encode_members({"nll.npy": npy})
    pytargets.TARGETS["kl_ref"](data)           # no finding
    p = tmp_path / "ref.npz"
    import zipfile
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("nll.npy", npy)
    with pytest.raises(FormatError, match="'nll'") as ei:
        _Reference(p)
    assert type(ei.value) is FormatError and str(p) in str(ei.value)
