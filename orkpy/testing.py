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
