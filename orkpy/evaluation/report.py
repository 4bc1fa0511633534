"""The quantization report (``orkpy quant-report``): reconstruction error of
every kind on a seeded Gaussian weight and a heavy-tailed one."""
import numpy as np

from ..kernels.quant import KINDS, quantize


def synthetic_weights(rows=1024, cols=4096, seed=0):
    """Two seeded (rows, cols) float32 weights.

    ``gaussian``: i.i.d. N(0, 1).
    ``heavy-tailed``: Student-t with 3 degrees of freedom (scaled to unit
    variance), plus 1% of input columns scaled x20 -- the outlier-channel
    pattern of real LLM weights.
    """
    rng = np.random.default_rng(seed)
    gauss = rng.standard_normal((rows, cols)).astype(np.float32)
    t = rng.standard_t(3, size=(rows, cols)) / np.sqrt(3.0)
    cols_out = rng.choice(cols, size=max(1, cols // 100), replace=False)
    t[:, cols_out] *= 20.0
    return {"gaussian": gauss, "heavy-tailed": t.astype(np.float32)}


def reconstruction_errors(w, threads=None):
    """{kind: (rms_error, relative_rms_error)} for plain absmax quantization."""
    ref = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
    out = {}
    for kind in KINDS:
        d = quantize(w, kind, threads=threads).dequantize() - w
        rms = float(np.sqrt(np.mean(d.astype(np.float64) ** 2)))
        out[kind] = (rms, rms / ref)
    return out


def quant_report(rows=1024, cols=4096, seed=0, threads=None):
    """Rows of (weight, kind, rms, rel_rms) and per weight the NF4/int4 ratio."""
    rows_out = []
    ratios = {}
    for name, w in synthetic_weights(rows, cols, seed).items():
        errs = reconstruction_errors(w, threads=threads)
        for kind, (rms, rel) in errs.items():
            rows_out.append((name, kind, rms, rel))
        ratios[name] = errs["nf4"][0] / errs["int4"][0]
    return rows_out, ratios


def format_quant_report(rows_out, ratios, shape, seed):
    lines = [f"quantization report: seeded weights of shape {shape}, seed {seed}, per-row absmax scale",
             f"{'weight':<14}{'kind':<6}{'rms error':>12}{'rel. rms':>12}"]
    for name, kind, rms, rel in rows_out:
        lines.append(f"{name:<14}{kind:<6}{rms:>12.6f}{rel:>12.6f}")
    for name, r in ratios.items():
        lines.append(f"NF4 / int4 rms-error ratio on {name}: {r:.4f}")
    return "\n".join(lines)
