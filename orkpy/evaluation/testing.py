"""Helpers for tests and benchmarks: random ggml blocks with sane scales."""
import time

import numpy as np

#: ggml type id -> (name, block_size, type_size, byte offsets of the fp16 scale fields in a block)
#: for every type orkpy dequantizes.
DEQUANT_TYPES = {
    0: ("F32", 1, 4, ()),
    1: ("F16", 1, 2, ()),
    30: ("BF16", 1, 2, ()),
    2: ("Q4_0", 32, 18, (0,)),
    3: ("Q4_1", 32, 20, (0, 2)),
    6: ("Q5_0", 32, 22, (0,)),
    7: ("Q5_1", 32, 24, (0, 2)),
    8: ("Q8_0", 32, 34, (0,)),
    10: ("Q2_K", 256, 84, (80, 82)),
    11: ("Q3_K", 256, 110, (108,)),
    12: ("Q4_K", 256, 144, (0, 2)),
    13: ("Q5_K", 256, 176, (0, 2)),
    14: ("Q6_K", 256, 210, (208,)),
    20: ("IQ4_NL", 32, 18, (0,)),
    23: ("IQ4_XS", 256, 136, (0,)),
}


def random_blocks(rng, type_id, nblocks, scale_lo=-4.0, scale_hi=4.0):
    """Random block bytes (uint8, 1-D) of a type; fp16 scale fields get finite values in
    [scale_lo, scale_hi] so every dequantized value is finite."""
    name, bs, ts, half_offsets = DEQUANT_TYPES[type_id]
    raw = rng.integers(0, 256, size=(nblocks, ts), dtype=np.uint8)
    if type_id == 0:
        raw = rng.standard_normal(nblocks).astype(np.float32).view(np.uint8).reshape(nblocks, ts)
    elif type_id == 1:
        raw = (rng.standard_normal(nblocks) * 10).astype(np.float16).view(np.uint8).reshape(nblocks, ts)
    elif type_id == 30:
        f = rng.standard_normal(nblocks).astype(np.float32)
        raw = (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(nblocks, ts)
    for off in half_offsets:
        h = rng.uniform(scale_lo, scale_hi, size=nblocks).astype(np.float16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(nblocks, 2)
    return np.ascontiguousarray(raw.reshape(-1))


def best_time(fn, repeat):
    """Best wall time of `repeat` calls of fn() (benchmarks report ratios of these)."""
    best = float("inf")
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def synthetic_forward_model(n_layer=2, n_embd=2048, n_ff=6144, n_head=16, n_head_kv=8, head_dim=128,
                            n_vocab=4096, path="fp32", seed=0, threads=None):
    """A ForwardModel with random weights and a real architecture's layer shapes
    (defaults: Qwen3-1.7B's), every linear on ``path`` (fp32, int8, nf4, int4).
    For benchmarks: no file, no tokenizer."""
    from ..runtime.model import LinearSpec, _forward_model, linear_names
    from ..kernels.packed import pack
    from ..kernels.quant import quantize

    rng = np.random.default_rng(seed)

    def lin(name, N, K):
        w = (rng.standard_normal((N, K), dtype=np.float32) * 0.02).astype(np.float32)
        if path == "fp32":
            return LinearSpec.f32(name, w)
        return LinearSpec.from_packed(name, pack(quantize(w, path, threads=threads)))

    qd, kvd = n_head * head_dim, n_head_kv * head_dim
    shapes = {"attn_q": (qd, n_embd), "attn_k": (kvd, n_embd), "attn_v": (kvd, n_embd), "attn_output": (n_embd, qd),
              "ffn_gate": (n_ff, n_embd), "ffn_up": (n_ff, n_embd), "ffn_down": (n_embd, n_ff)}
    hp = {"arch": "qwen3", "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, "n_head_kv": n_head_kv,
          "head_dim": head_dim, "n_ff": n_ff, "n_vocab": n_vocab, "n_rot": head_dim, "rope_type": 2, "rope_base": 1e6,
          "rope_freq_scale": 1.0, "norm_eps": 1e-6}
    names = linear_names(hp)
    linears = {n: lin(n, *shapes[n.split(".")[2]]) for n in names[:-1]}  # drawn in the order they always were
    floats = {"token_embd.weight": rng.standard_normal((n_vocab, n_embd), dtype=np.float32),
              "output_norm.weight": np.ones(n_embd, np.float32)}
    linears[names[-1]] = lin(names[-1], n_vocab, n_embd)
    for i in range(n_layer):
        for t, d in (("attn_norm", n_embd), ("ffn_norm", n_embd), ("attn_q_norm", head_dim), ("attn_k_norm", head_dim)):
            floats[f"blk.{i}.{t}.weight"] = np.ones(d, np.float32)
    return _forward_model(hp, floats.__getitem__, linears)


# ------------------------------------------------------------ NPU fake kernel --
#: Faults the fake kernel injects into an open device (tests/npu_fake/fake_kernel.h): jobs never
#: complete (NPUTimeoutError, then a core reset); a job is accepted but never runs (NPUError).
FAKE_HANG, FAKE_DROP = 1, 4


def fake_npu_device(backend="rknpu", *, faults=0, timeout_ms=10000):
    """An ``orkpy.runtime.npu.Device`` whose rknpu or rocket backend runs against the fake
    kernel driver instead of /dev (tests/npu_fake/fake_kernel.h; a test-only library that
    ``orkpy.runtime.npu.load_fake_kernel`` must have loaded first): test machinery, for
    exercising the device paths without a board. The fake enforces the driver's
    contract, executes the commands with the emulator and reports its state under
    ``info()["fake_kernel"]``; ``faults`` (FAKE_HANG | FAKE_DROP, later
    ``device.set_faults(bits)``) injects failures. The same as
    ``Device(backend, fake_kernel=backend)`` (tests/board/run_board.py --fake uses that)."""
    from ..runtime.npu import Device

    if backend not in ("rknpu", "rocket"):
        raise ValueError(f"the fake kernel stands in for a kernel driver: backend must be 'rknpu' or 'rocket', "
                         f"got {backend!r}")
    dev = Device(backend, fake_kernel=backend, timeout_ms=timeout_ms)
    if faults:
        dev.set_faults(faults)
    return dev
