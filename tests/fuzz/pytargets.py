"""Fuzz targets for orkpy's Python parsers (run by tests/fuzz/pyfuzz.py under
atheris, or its built-in mutator when atheris is missing; see run.py).

A target is a function ``one(data: bytes)`` that hands the bytes to one reader
and checks what comes back. It *finds a bug* when anything escapes other than
the exception class the reader documents (``allowed``): an IndexError, a
KeyError, a RecursionError, a MemoryError, an OSError, a UnicodeError (a
``ValueError`` by inheritance, but never a deliberate validation error), or a
failed invariant (AssertionError). Hangs are caught by the driver's per-input
time limit.

Seeds: ``seeds(shared)`` builds them at run time, from the real files in
``../shared`` when present (never copied into the repository) and from orkpy's
own writers; the small stored corpora are ``tests/fuzz/corpus/<target>/``.
"""
import functools
import json
import os
import pathlib
import shutil
import struct
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
SHARED = HERE.parents[2] / "shared"


class Target:
    def __init__(self, name, fn, allowed, seeds, doc, dict_file=None):
        self.name, self.fn, self.allowed, self.seeds, self.doc, self.dict_file = name, fn, allowed, seeds, doc, dict_file

    def __call__(self, data):
        try:
            self.fn(data)
        except self.allowed() as e:
            if isinstance(e, UnicodeError):  # a ValueError, but an accident, not a validation
                raise
        return None


TARGETS = {}


def target(name, allowed, seeds, dict_file=None):
    def deco(fn):
        TARGETS[name] = Target(name, fn, allowed, seeds, (fn.__doc__ or "").strip().splitlines()[0], dict_file)
        return fn
    return deco


# ------------------------------------------------------------- scratch files --

@functools.lru_cache(maxsize=None)
def _scratch():
    """A private scratch directory (in ORKPY_FUZZ_SCRATCH when set: run.py removes it after
    the run, since libFuzzer/atheris leave the process without running cleanups)."""
    base = os.environ.get("ORKPY_FUZZ_SCRATCH") or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    if base:
        os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix="orkpy-fuzz-", dir=base)


def _put(name, data):
    """data written to a fresh file (a new inode: nothing still maps the old one)"""
    p = os.path.join(_scratch(), name)
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass
    with open(p, "wb") as f:
        f.write(data)
    return p


def _shared(rel):
    p = SHARED / rel
    return p if p.is_file() else None


# ----------------------------------------------------------------- imatrix --

def _imatrix_allowed():
    from orkpy import FormatError
    return (FormatError, NotImplementedError)   # NotImplementedError: a MoE entry (documented)


def _imatrix_check(path):
    from orkpy.quantization.imatrix import Imatrix

    im = Imatrix.load(path)
    im.sha256()
    im.to_dict()
    for n in im.names():
        v = im.values(n)
        assert v.shape == (len(im.entry(n)),) and v.dtype == np.float32
    # what the writers make of a loaded imatrix, the reader must read back
    for fmt in ("gguf", "dat"):
        out = os.path.join(_scratch(), f"roundtrip.{fmt}")
        try:
            im.save(out, format=fmt)
        except ValueError:   # documented: does not fit that format (name length, float32 range, no data)
            continue
        back = Imatrix.load(out)
        kept = [n for n in im.names() if fmt == "gguf" or im.entry(n).count > 0]
        assert back.names() == kept, (fmt, back.names(), kept)
        assert all(len(back.entry(n)) == len(im.entry(n)) for n in kept)


@target("imatrix_dat", _imatrix_allowed, lambda shared: _imatrix_seeds(shared, "dat"), dict_file="imatrix.dict")
def imatrix_dat(data):
    """Imatrix.load on a legacy llama.cpp .dat (and on anything that is not GGUF)."""
    _imatrix_check(_put("x.dat", data))


@target("imatrix_gguf", _imatrix_allowed, lambda shared: _imatrix_seeds(shared, "gguf"), dict_file="imatrix.dict")
def imatrix_gguf(data):
    """Imatrix.load on a GGUF imatrix (the container is checked by the C reader first)."""
    _imatrix_check(_put("x.gguf", data))


def _imatrix_seeds(shared, fmt):
    from orkpy.quantization.imatrix import Imatrix

    out = {}
    ims = []
    dat = _shared("models/stories260K/stories260K-imatrix-B.dat") if shared else None
    if dat is not None:
        ims.append(("stories260K", Imatrix.load(dat)))
    small = Imatrix(chunk_size=4, chunks=2, datasets=["a.txt"])
    small.add("blk.0.attn_q.weight", np.arange(1, 9, dtype=np.float64), 8)
    small.add("output.weight", np.zeros(3), 0)
    ims.append(("small", small))
    for name, im in ims:
        p = os.path.join(_scratch(), f"seed.{fmt}")
        im.save(p, format=fmt)
        out[f"{name}.{fmt}"] = pathlib.Path(p).read_bytes()
    if fmt == "gguf":   # the 2-D forms and the in_sum tensors newer llama.cpp writes
        from orkpy import write_gguf
        p = os.path.join(_scratch(), "seed2.gguf")
        write_gguf(p, [("general.type", "STRING", "imatrix"), ("imatrix.datasets", "ARRAY", ["x"]),
                       ("imatrix.chunk_count", "UINT32", 3), ("imatrix.chunk_size", "UINT32", 512)],
                   [("w.in_sum", np.ones((1, 4), np.float32)), ("w.in_sum2", np.full((1, 4), 2.0, np.float32)),
                    ("w.counts", np.full((1, 1), 512.0, np.float32))])
        out["2d.gguf"] = pathlib.Path(p).read_bytes()
    return out


# ---------------------------------------------------------------- manifest --

_MODEL_DIR = None


def _model_dir():
    """A tiny quantized model directory (synthetic, 1 block) saved once per process."""
    global _MODEL_DIR
    if _MODEL_DIR is None:
        import orkpy.evaluation.synthetic as syn
        from orkpy.quantization.calibrate import quantize_model

        base = tempfile.mkdtemp(prefix="orkpy-fuzz-model-", dir=_scratch())
        syn.make_synthetic(base, n_layer=1, n_embd=64, n_ff=96, n_head=2, n_head_kv=1)
        q = quantize_model(os.path.join(base, "synthetic-F16.gguf"), os.path.join(base, "synthetic-alloc.map"),
                           progress=False, log=lambda s: None)
        d = os.path.join(base, "model")
        q.save(d)
        _MODEL_DIR = d
    return _MODEL_DIR


def _manifest_allowed():
    from orkpy import FormatError
    return (FormatError,)


@target("manifest", _manifest_allowed, lambda shared: _manifest_seeds(), dict_file="manifest.dict")
def manifest(data):
    """load_quantized on a model directory whose manifest.json is the input (the blobs are valid)."""
    from orkpy.quantization.calibrate import MANIFEST, load_quantized

    d = _model_dir()
    p = os.path.join(d, MANIFEST)
    os.unlink(p)
    with open(p, "wb") as f:
        f.write(data)
    m = load_quantized(d)
    assert isinstance(m.manifest, dict)


def _manifest_seeds():
    from orkpy.quantization.calibrate import MANIFEST
    d = _model_dir()
    good = pathlib.Path(d, MANIFEST).read_bytes()
    m = json.loads(good)
    compact = json.dumps(m, separators=(",", ":"), sort_keys=True).encode()
    return {"saved.json": good, "compact.json": compact}


# ----------------------------------------------------------------- tier map --

def _tiermap_allowed():
    from orkpy import FormatError
    return (FormatError,)


@target("tiermap", _tiermap_allowed, lambda shared: _tiermap_seeds(shared))
def tiermap(data):
    """TierMap.load on emit-map text; a map that loads must save and load back equal."""
    from orkpy import TierMap

    tm = TierMap.load(_put("x.map", data))
    tm.counts_by_tier()
    tm.int8_share()
    out = os.path.join(_scratch(), "roundtrip.map")
    tm.save(out)
    back = TierMap.load(out)
    assert back.entries == tm.entries and back.tied == tm.tied, "save -> load changed the map"
    assert repr(back.threshold) == repr(tm.threshold), (back.threshold, tm.threshold)


def _tiermap_seeds(shared):
    import orkpy

    out = {}
    for rel in ("models/qwen3-skeleton/qwen3-skel-untied-Q4_K_M.gguf", "models/stories260K/stories260K-Q4_0.gguf"):
        p = _shared(rel) if shared else None
        if p is not None:
            dst = os.path.join(_scratch(), "seed.map")
            orkpy.tier_map(str(p)).save(dst)
            out[p.name + ".map"] = pathlib.Path(dst).read_bytes()
    return out


# -------------------------------------------------------------- safetensors --

def _st_allowed():
    from orkpy import FormatError
    return (FormatError,)


@target("safetensors", _st_allowed, lambda shared: _st_seeds(shared), dict_file="safetensors.dict")
def safetensors(data):
    """load_safetensors on one .safetensors file; every returned array is read in full."""
    import orkpy

    st = orkpy.load_safetensors(_put("x.safetensors", data))
    data_len = len(data)
    for name, a in st.items():
        assert isinstance(a, np.ndarray) and not a.flags.writeable, name
        assert a.nbytes <= 4 * data_len, (name, a.nbytes, data_len)   # BF16 -> float32 doubles
        np.asarray(a).tobytes()
    assert isinstance(st.metadata, dict)


def st_bytes(tensors, metadata=None, header_extra=None):
    """A safetensors file by hand: {name: array} (little-endian, in order)."""
    header, blobs, pos = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    codes = {"float32": "F32", "float16": "F16", "int8": "I8", "uint8": "U8", "int32": "I32", "int64": "I64",
             "bool": "BOOL", "float64": "F64", "uint16": "BF16"}
    for name, a in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": codes[a.dtype.name], "shape": list(a.shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    header.update(header_extra or {})
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def _st_seeds(shared):
    import orkpy

    out = {"small.safetensors": st_bytes({"a": np.arange(6, dtype=np.float32).reshape(2, 3),
                                          "b": np.array([1, 0, 1], np.bool_), "c": np.zeros((0, 4), np.int8)},
                                         metadata={"format": "pt"})}
    p = _shared("models/stories260K/stories260K-F16.gguf") if shared else None
    if p is not None:   # real weights, a few small tensors of the real model
        with orkpy.GGUFFile(str(p)) as g:
            ts = {t.name: g.tensor(t.name) for t in g.tensors if t.n_elements <= 4096}
        sel = dict(list(ts.items())[:6])
        sel["bf16"] = (np.asarray(sel[next(iter(sel))], np.float32).view(np.uint32) >> 16).astype(np.uint16)
        out["stories260K.safetensors"] = st_bytes(sel, metadata={"source": p.name})
    return out


# ---------------------------------------------------------------- tokenizer --
# The input is a compact vocabulary (decode_vocab never fails: any bytes give a
# vocabulary), written with orkpy.write_gguf and read back by
# Tokenizer.from_gguf, then used to encode and decode a text from the input.
#
#   flags u8: bit 0 model (0 llama, 1 gpt2); bits 1/2 add_bos present/value; bits 3/4 add_eos;
#             bits 5/6 add_space_prefix; bit 7 tokenizer.ggml.pre = "qwen2"
#   more u8:  bits 0/1/2 bos/eos/unk ids present; bit 3 scores; bit 4 token types; bit 5 merges;
#             bit 6 the ids typed FLOAT32; bit 7 the flags typed UINT8 (mistyped metadata)
#   u16 bos, u16 eos, u16 unk; u16 n_tokens; per token: len u8 (255: u16 follows), bytes,
#   [type u8], [score f32]; [u16 n_merges; per merge: len, bytes]; the rest: text (UTF-8, errors
#   replaced)

def decode_vocab(data):
    """(GGUF metadata triples, text) of a compact vocabulary; never fails."""
    b = bytes(data) + bytes(12)
    n_data = len(data)
    f, g = b[0], b[1]
    ids = struct.unpack_from("<HHH", b, 2)
    n = b[8] | b[9] << 8
    i = 10
    toks, types, scores = [], [], []
    want_t, want_s = g & 16, g & 8

    def blob(i):
        ln = b[i] if i < n_data else 0
        i += 1
        if ln == 255:
            ln = b[i] | b[i + 1] << 8 if i + 1 < n_data else 0
            i += 2
        return b[i:min(i + ln, n_data)], i + ln

    for _ in range(n):
        if i >= n_data:
            break
        t, i = blob(i)
        toks.append(t.decode("utf-8", "surrogateescape"))
        if want_t:
            types.append(b[i] if i < n_data else 0)
            i += 1
        if want_s:
            sb = b[i:i + 4]
            scores.append(struct.unpack("<f", sb + bytes(4 - len(sb)))[0])
            i += 4
    merges = []
    if g & 32:
        nm = (b[i] | b[i + 1] << 8) if i + 1 < n_data else 0
        i += 2
        for _ in range(nm):
            if i >= n_data:
                break
            m, i = blob(i)
            merges.append(m.decode("utf-8", "surrogateescape"))
    text = bytes(data[i:]).decode("utf-8", "replace")
    meta = [("tokenizer.ggml.model", "STRING", "gpt2" if f & 1 else "llama"),
            ("tokenizer.ggml.tokens", "ARRAY", toks)]
    if f & 128:
        meta.append(("tokenizer.ggml.pre", "STRING", "qwen2"))
    if g & 16:
        meta.append(("tokenizer.ggml.token_type", "ARRAY", np.array(types, np.int32)))
    if g & 8:
        meta.append(("tokenizer.ggml.scores", "ARRAY", np.array(scores, np.float32)))
    if g & 32:
        meta.append(("tokenizer.ggml.merges", "ARRAY", merges))
    for bit, key, v in ((2, "add_bos_token", f & 4), (8, "add_eos_token", f & 16), (32, "add_space_prefix", f & 64)):
        if f & bit:   # more bit 7: the flags mistyped (UINT8 0..2 instead of BOOL)
            meta.append((f"tokenizer.ggml.{key}", "UINT8", (v != 0) + (bit == 8)) if g & 128 else
                        (f"tokenizer.ggml.{key}", "BOOL", bool(v)))
    for bit, key, v in zip((1, 2, 4), ("bos_token_id", "eos_token_id", "unknown_token_id"), ids):
        if g & bit:   # more bit 6: the ids mistyped as FLOAT32 (0xFFFF inf, 0xFFFE NaN, odd values + 0.5)
            meta.append((f"tokenizer.ggml.{key}", "FLOAT32", _odd_float(v)) if g & 64 else
                        (f"tokenizer.ggml.{key}", "UINT32", v))
    return meta, text


def _odd_float(v):
    return {0xFFFF: float("inf"), 0xFFFE: float("nan"), 0xFFFD: float("-inf")}.get(v, v + 0.5 * (v & 1))


def encode_vocab(meta, text=""):
    """The inverse of decode_vocab for a GGUF's tokenizer metadata (dict) and a text."""
    def blob(s):
        b = s.encode("utf-8", "surrogateescape")
        return (bytes([len(b)]) if len(b) < 255 else b"\xff" + struct.pack("<H", len(b))) + b
    f = (1 if meta["tokenizer.ggml.model"] == "gpt2" else 0) | (128 if meta.get("tokenizer.ggml.pre") else 0)
    for bit, key in ((2, "add_bos_token"), (8, "add_eos_token"), (32, "add_space_prefix")):
        v = meta.get(f"tokenizer.ggml.{key}")
        if v is not None:
            f |= bit | (2 * bit if v else 0)
    g = 0
    ids = []
    for bit, key in ((1, "bos_token_id"), (2, "eos_token_id"), (4, "unknown_token_id")):
        v = meta.get(f"tokenizer.ggml.{key}")
        g |= bit if v is not None else 0
        ids.append(0 if v is None else int(v) & 0xFFFF)
    types, scores, merges = (meta.get(f"tokenizer.ggml.{k}") for k in ("token_type", "scores", "merges"))
    g |= (8 if scores is not None else 0) | (16 if types is not None else 0) | (32 if merges is not None else 0)
    toks = meta["tokenizer.ggml.tokens"]
    out = bytearray([f, g]) + struct.pack("<HHHH", *ids, len(toks))
    for i, t in enumerate(toks):
        out += blob(t)
        if types is not None:
            out.append(int(types[i]) & 0xFF)
        if scores is not None:
            out += struct.pack("<f", float(scores[i]))
    if merges is not None:
        out += struct.pack("<H", len(merges))
        for m in merges:
            out += blob(m)
    return bytes(out) + text.encode("utf-8")


def _tok_allowed():
    return (ValueError,)   # from_gguf and encode document ValueError (FormatError/GGUFError are ValueErrors)


@target("tokenizer", _tok_allowed, lambda shared: _tok_seeds(shared))
def tokenizer(data):
    """Tokenizer.from_gguf on a vocabulary GGUF written by write_gguf, then encode / decode."""
    from orkpy import write_gguf
    from orkpy.runtime.tokenizer import Tokenizer

    meta, text = decode_vocab(data)
    p = os.path.join(_scratch(), "vocab.gguf")
    try:
        write_gguf(p, meta, [])
    except (ValueError, TypeError):
        return   # not a vocabulary the writer can express: not the reader's input
    tok = Tokenizer.from_gguf(p)
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and ((ids >= 0) & (ids < tok.n_vocab)).all(), ids
    assert isinstance(tok.decode(ids), str) and isinstance(tok.decode(ids, special=True), str)
    for i in ids[:8].tolist():
        assert isinstance(tok.token_to_piece(i, special=True), bytes)


_TOK_TEXT = "Once upon a time, there was a little cat. It said: \"Hi!\"\n  \t café 日本 😀 <s> 123"


def _vocab_subset(meta, n):
    """The first n tokens of a real vocabulary and the merges among them (a seed small
    enough to be rebuilt thousands of times a second); special ids kept when in range."""
    toks = meta["tokenizer.ggml.tokens"]
    if len(toks) <= n:
        return meta
    out = dict(meta)
    out["tokenizer.ggml.tokens"] = toks = toks[:n]
    for k in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if k in out:
            out[k] = np.asarray(out[k])[:n]
    if out.get("tokenizer.ggml.merges") is not None:
        have = set(toks)
        out["tokenizer.ggml.merges"] = [m for m in out["tokenizer.ggml.merges"]
                                        if m.replace(" ", "", 1) in have and all(x in have for x in m.split(" ", 1))]
    for k in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"):
        if k in out and not 0 <= int(out[k]) < n:
            del out[k]
    return out


def _tok_seeds(shared):
    import orkpy
    import orkpy.evaluation.synthetic as syn

    out = {}
    toks, scores, types = syn._vocab()
    out["synthetic.vocab"] = encode_vocab({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": toks,
                                           "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
                                           "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                                           "tokenizer.ggml.unknown_token_id": 0}, _TOK_TEXT)
    for rel in ("models/stories260K/stories260K-F32.gguf", "models/qwen3-skeleton/qwen3-skel-tied-Q4_K_M.gguf"):
        p = _shared(rel) if shared else None
        if p is None:
            continue
        with orkpy.GGUFFile(str(p)) as g:
            meta = {k: v for k, v in g.metadata.items() if k.startswith("tokenizer.ggml.")}
        meta = _vocab_subset(meta, 600)
        text = ""
        tp = _shared("text/tinystories-val-B.txt")
        if tp is not None:
            text = tp.read_text(encoding="utf-8")[:120]
        out[p.name + ".vocab"] = encode_vocab(meta, text + _TOK_TEXT)
    return out


# --------------------------------------------------------------- NPU stream --
# Input: byte 0 = task_number - 1 (bits 0-2) and the PC amount choice (bits 3-4: the usual
# 104-qword body, 0, 255, or derived from the stream length); the rest is a command file
# (binary little-endian qwords or hex text) read by read_commands, listed by dump and run by
# the strict emulator with the stream mapped at CMD and three operand buffers.

_CMD, _IN, _W, _OUT = 0x00010000, 0x00100000, 0x00200000, 0x00300000
_OPBUF = 1 << 16


def _npu_allowed():
    from orkpy import FormatError
    from orkpy.runtime.npu import NPUCommandError
    return (FormatError, NPUCommandError)


@target("npu_stream", _npu_allowed, lambda shared: _npu_seeds(shared))
def npu_stream(data):
    """orkpy.runtime.npu.read_commands + dump + emulate on a command file from the input."""
    from orkpy.runtime import npu

    if not data:
        return
    ctl, body = data[0], data[1:]
    q = npu.read_commands(_put("x.cmd", body))
    assert q.dtype == np.uint64 and q.ndim == 1 and len(q) > 0
    listing = npu.dump(q)
    assert listing.count("\n") == len(q) - 1
    tasks = (ctl & 7) + 1
    amount = (npu.pc_amount(104), 0, 255, npu.pc_amount(max(0, len(q) - 4)))[(ctl >> 3) & 3]
    if len(q) > (1 << 14):
        return
    cmd = np.frombuffer(q.astype("<u8").tobytes(), np.uint8).copy()
    bufs = [(_CMD, cmd)] + [(a, np.full(_OPBUF, i * 37 + 1, np.uint8)) for i, a in enumerate((_IN, _W, _OUT))]
    st = npu.emulate(bufs, _CMD, amount, tasks)
    assert st["tasks"] <= tasks


def _npu_seeds(shared):
    from orkpy.runtime import npu

    out = {}
    for i, (M, K, N, caps) in enumerate([(1, 64, 32, {}), (4, 256, 64, dict(max_n=32)),
                                         (8, 128, 64, dict(max_k=64, max_n=32))]):
        q = npu.plan_commands(M, K, N, _CMD, _IN, _W, _OUT, **caps)
        tasks = min(len(q) // 108, 8)
        out[f"plan{i}.bin"] = bytes([tasks - 1]) + q.astype("<u8").tobytes()
        out[f"plan{i}.txt"] = bytes([tasks - 1]) + npu.dump(q).encode()
    g = _shared("docs/npu/golden-matmul-regcmd.txt") if shared else None
    if g is not None:
        out["golden.txt"] = b"\x00" + g.read_bytes()
    return out


# ------------------------------------------------------------ act_scales --

def _act_allowed():
    from orkpy import FormatError
    return (FormatError,)


@target("act_scales", _act_allowed, lambda shared: _act_seeds(), dict_file="manifest.dict")
def act_scales(data):
    """ActCalibration.load on act_scales.json; what loads is used as load_model would and saves back equal."""
    from orkpy.runtime.actcal import ActCalibration, resolve
    from orkpy.kernels.actspec import ActSpec

    cal = ActCalibration.load(_put("act_scales.json", data))
    assert 0 <= cal.prefix < 2 ** 31
    for n, r in cal.ranges.items():
        assert all(np.isfinite(v) and v >= 0 for v in r.values()), (n, r)
        assert np.isfinite(cal.channel_absmax[n]).all()
        K = int(cal.channels[n].max()) + 1 if len(cal.channels[n]) else 1
        for mode in ("static", "per_token_outliers"):
            try:
                resolve(ActSpec(mode, n_outliers=max(1, len(cal.channels[n]))), n, cal, K, "fuzz")
            except ValueError as e:   # documented: a range of 0 (only zeros seen), too few channels
                assert "zeros" in str(e) or "act_outliers" in str(e), e
    back = ActCalibration.from_bytes(cal.to_bytes(), "roundtrip")
    assert back.to_bytes() == cal.to_bytes()


def _act_seeds():
    from orkpy.runtime.actcal import ActCalibration

    name = "blk.0.attn_q.weight"
    cal = ActCalibration({name: {"max": 2.0, "mse": 1.5, "mse4": 1.0}, "output.weight": {"max": 0.5, "mse": 0.5}},
                         {name: [3, 1], "output.weight": []}, {name: [2.0, 1.5], "output.weight": []},
                         info={"model": "m.gguf", "n_ctx": 64, "chunks": 2, "tokens_sha256": "0" * 64, "prefix": 1,
                               "grid": {"per_octave": 32, "octaves": 12}},
                         clipped={name: {"mse": 0.01}})
    good = cal.to_bytes()
    out = {"small.json": good}
    doc = json.loads(good)
    big = "1" + "0" * 400      # the integer cases of the attack campaign (issue 5)
    for key, path, v in (("max-400-digits", ("linears", name, "max"), big),
                         ("absmax-400-digits", ("linears", name, "outlier_absmax"), f"[{big}, 1.0]"),
                         ("prefix-1e30", ("info", "prefix"), "1" + "0" * 30),
                         ("clipped-400-digits", ("linears", name, "clipped", "mse"), big),
                         ("max-1e300", ("linears", name, "max"), "1e300")):
        d = json.loads(good)
        o = d
        for k in path[:-1]:
            o = o[k]
        o[path[-1]] = "@@"
        out[key + ".json"] = json.dumps(d, indent=1).replace('"@@"', v).encode()
    return out


# ------------------------------------------------------------ KL reference --
# Input: byte 0 says how the rest becomes the reference file (.npz) read by KL mode
# (perplexity(kld_base=), orkpy.evaluation.ppl._Reference):
#   bit 0 set: the rest is the .npz itself (the zip container, its CRCs, the .npy headers);
#   bit 0 clear: the rest is a list of members, each [name length u8][name][data length u32 LE][.npy
#                bytes] (lengths cut at the end of the input), zipped by zipfile with valid CRCs
#                (bit 1: deflated), so that mutations reach the .npy headers and the values.

def encode_members(members):
    """The framed form (byte 0 clear) of {name: .npy bytes}."""
    out = bytearray([0])
    for name, npy in members.items():
        nb = name.encode()
        out += bytes([len(nb)]) + nb + struct.pack("<I", len(npy)) + npy
    return bytes(out)


def npy_bytes(a):
    import io
    b = io.BytesIO()
    np.lib.format.write_array(b, np.asanyarray(a), allow_pickle=False)
    return b.getvalue()


def decode_members(data):
    """[(name, .npy bytes)] of the framed form; never fails."""
    out, i, n = [], 1, len(data)
    while i < n:
        ln = data[i]
        name = bytes(data[i + 1:i + 1 + ln]).decode("latin-1")
        i += 1 + ln
        dl = struct.unpack("<I", bytes(data[i:i + 4]).ljust(4, b"\0"))[0]
        i += 4
        out.append((name, bytes(data[i:i + dl])))
        i += dl
    return out


def _klref_allowed():
    from orkpy import FormatError
    return (FormatError,)


@target("kl_ref", _klref_allowed, lambda shared: _klref_seeds(shared), dict_file="klref.dict")
def kl_ref(data):
    """The KL reference reader (perplexity(kld_base=), .npz v1/v2); what loads is decoded and scored."""
    import math
    import zipfile

    from orkpy.evaluation.ppl import _Reference

    if not data:
        return
    if data[0] & 1:
        p = _put("x.npz", bytes(data[1:]))
    else:
        p = os.path.join(_scratch(), "x.npz")
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        method = zipfile.ZIP_DEFLATED if data[0] & 2 else zipfile.ZIP_STORED
        with zipfile.ZipFile(p, "w", method) as zf:
            for name, npy in decode_members(data):
                info = zipfile.ZipInfo(name)   # cuts the name at a NUL, drops a leading '/'
                if info.filename and not info.filename.endswith("/"):   # else not a member zipfile writes
                    info.compress_type = method
                    zf.writestr(info, npy)
    ref = _Reference(p)
    # what perplexity(kld_base=) does with it: the rows of every whole chunk, KL against a model, base PPL
    assert ref.rows >= 1 and ref.n_vocab >= 1 and ref.n_ctx >= 4
    lp, top = ref.logprobs_rows(slice(0, ref.rows))
    assert lp.shape == (ref.rows, ref.n_vocab) and top.shape == (ref.rows,)
    assert np.isfinite(lp).all() and (lp <= 0).all()
    assert ((top >= 0) & (top < ref.n_vocab)).all()
    assert (np.abs(np.log(np.exp(lp).sum(axis=1))) < 5e-3).all()
    model = np.log(np.full(ref.n_vocab, 1.0 / ref.n_vocab))      # a uniform model's log-probs
    kl = (np.exp(lp) * (lp - model)).sum(axis=1)
    assert np.isfinite(kl).all() and (kl > -5e-3).all(), kl
    first = ref.n_ctx // 2
    per_chunk = ref.n_ctx - first - 1
    assert ref.rows % per_chunk == 0 and len(ref.tokens) >= ref.rows // per_chunk * ref.n_ctx
    assert len(ref.nll) == ref.rows
    assert math.isfinite(math.exp(float(ref.nll.mean())))


def _klref_file(rng, V, n_ctx, chunks, version=2, flat=False, masked=False):
    """The members of a reference file as perplexity(save_logprobs=) writes it, from random logits."""
    from orkpy.evaluation.ppl import LP_VERSION, _log_softmax, encode_logprobs

    first = n_ctx // 2
    per = n_ctx - first - 1
    tokens = rng.integers(0, V, chunks * n_ctx).astype(np.int32)
    logits = (rng.standard_normal((chunks * per, V)) * 4).astype(np.float32)
    if flat:
        logits[0] = 1.0
    if masked:
        logits[-1, : V // 2] = -np.inf
        logits[-1, V - 1] = 80.0          # the rest more than 64 nats below the top: coded at the range
    lp = _log_softmax(logits)
    tg = tokens.reshape(chunks, n_ctx)[:, first + 1:].reshape(-1)
    if masked:
        tg[-1] = V - 1
        tokens.reshape(chunks, n_ctx)[-1, -1] = V - 1
    nll = -lp[np.arange(len(lp)), tg]
    if version == 1:
        return {"logprobs": lp.astype(np.float32), "nll": nll, "tokens": tokens, "n_ctx": np.int64(n_ctx)}
    codes, top, rng_, top_id = encode_logprobs(lp)
    return {"version": np.int64(LP_VERSION), "nll": nll, "tokens": tokens, "n_ctx": np.int64(n_ctx),
            "lp_codes": codes, "lp_top": top, "lp_range": rng_, "top_id": top_id}


def _npz(members, compressed=False):
    import io
    b = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(b, **members)
    return b.getvalue()


def _klref_seeds(shared):
    rng = np.random.default_rng(5)
    out = {}
    small = _klref_file(rng, 16, 8, 2)
    out["small-v2.npz"] = b"\x01" + _npz(small)
    out["small-v2.framed"] = encode_members({k + ".npy": npy_bytes(v) for k, v in small.items()})
    out["small-v2-deflated.npz"] = b"\x01" + _npz(small, compressed=True)
    out["flat-masked.framed"] = encode_members({k + ".npy": npy_bytes(v) for k, v in
                                                _klref_file(rng, 24, 6, 2, flat=True, masked=True).items()})
    v1 = _klref_file(rng, 12, 4, 3, version=1)
    out["small-v1.framed"] = encode_members({k + ".npy": npy_bytes(v) for k, v in v1.items()})
    out["small-v1.npz"] = b"\x01" + _npz(v1)
    st = _shared("models/stories260K/stories260K-F32.gguf") if shared else None
    text = _shared("text/tinystories-val-B.txt") if shared else None
    if st is not None and text is not None:   # the real writer on a real model: 2 chunks of 4 tokens
        import orkpy
        m = orkpy.load_model(str(st))
        p = os.path.join(_scratch(), "seed-ref.npz")
        orkpy.perplexity(m, text.read_text(encoding="utf-8")[:2000], n_ctx=4, chunks=2, progress=False,
                         save_logprobs=p)
        raw = pathlib.Path(p).read_bytes()
        out["stories260K.npz"] = b"\x01" + raw
        with np.load(p) as z:
            out["stories260K.framed"] = encode_members({k + ".npy": npy_bytes(z[k]) for k in z.files})
    return out


# ------------------------------------------------------------------ helpers --

def corpus_files(name):
    d = CORPUS / name
    return sorted(p for p in d.iterdir() if p.is_file()) if d.is_dir() else []


def write_seeds(name, out, shared=True):
    """The stored corpus plus the run-time seeds of a target, into directory out."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for p in corpus_files(name):
        shutil.copyfile(p, out / p.name)
        n += 1
    for k, v in TARGETS[name].seeds(shared and SHARED.is_dir()).items():
        (out / f"seed-{k}").write_bytes(v)
        n += 1
    return n


def cleanup():
    """Remove the scratch directory (and the model directory inside it)."""
    global _MODEL_DIR
    shutil.rmtree(_scratch(), ignore_errors=True)
    _scratch.cache_clear()
    _MODEL_DIR = None


__all__ = ["TARGETS", "Target", "decode_vocab", "encode_vocab", "st_bytes", "encode_members", "decode_members",
           "npy_bytes", "write_seeds", "corpus_files",
           "cleanup", "io"]
