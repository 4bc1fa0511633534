"""bench/accuracy.py end to end on stories260K (tiny settings): llama.cpp's 4-bit files are made
and scored by the live llama.cpp in the same run, orkpy's rows use the allocation of llama.cpp's
Q4_0 file, and the orderings the weight-accuracy issue gates hold (GPTQ beats plain rounding; the
float-activation row is below the int8-activation one)."""
import json

import pytest

from conftest import load_bench


@pytest.mark.slow
@pytest.mark.gate
def test_accuracy_bench_on_stories260k(tmp_path):
    acc = load_bench("accuracy")
    acc.main(["--model", "stories260k", "--chunks", "4", "--calib-chunks", "4", "--ctx", "256",
              "--methods", "rtn", "gptq", "gptq+awq", "--work", str(tmp_path),
              "--json-out", str(tmp_path / "{model}.json")])
    d = json.loads((tmp_path / "stories260k.json").read_text())
    rows = {(r["source"], r["what"]): r for r in d["rows"]}
    assert {w for s, w in rows if s == "llama.cpp"} == {"F32", "Q8_0", "Q4_0", "IQ4_NL", "IQ4_NL+im", "Q4_K_M",
                                                        "Q4_K_M+im"}
    q8, q40 = rows[("llama.cpp", "Q8_0")], rows[("llama.cpp", "Q4_0")]
    assert 0 < q8["kld"] < q40["kld"] and q40["bytes"] < q8["bytes"]
    rtn, gptq = rows[("orkpy", "nf4 rtn w4a8")], rows[("orkpy", "nf4 gptq w4a8")]
    assert gptq["kld"] < 0.9 * rtn["kld"]                      # 40 chunks of 512: 0.088 vs 0.125
    assert rows[("orkpy", "nf4 gptq w-only")]["kld"] < gptq["kld"]
    assert rtn["bytes"] == gptq["bytes"] and 0 < rtn["bpw"] < 8
    best = rows[("orkpy", "nf4 gptq+awq w4a8")]
    assert best["kld"] < q40["kld"]                            # 40 chunks of 512: 0.083 vs llama.cpp Q4_0 0.112
