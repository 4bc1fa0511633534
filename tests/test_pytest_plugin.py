"""orkpy's pytest plugin (orkpy/evaluation/pytest_plugin.py): registered by its entry point, run by pytest's
own ``pytester`` on stories260K (Q4_0 and Q8_0 against the F32 reference, 4 chunks of 128 tokens of
the TinyStories text): a passing and a failing gate, the report's text, the reference made once per
session, a clear failure when an option is missing. orkpy's own gate below uses the plugin's
fixture too."""
import importlib.metadata
import re

import pytest

pytest_plugins = ["pytester"]

ST = "models/stories260K"
USER_TEST = '''
def test_q4_close_to_float(orkpy_gate):
    orkpy_gate(max_kl={max_kl}, max_dppl_rel=0.5)


def test_q8_closer(orkpy_gate, orkpy_reference):
    import orkpy
    r = orkpy_gate(orkpy.load_model("{q8}"), max_kl=0.01, min_same_top=0.9)   # a loaded model too
    assert r.kl < 0.01 and orkpy_reference.chunks == 4
'''


def test_registered_by_its_entry_point():
    eps = importlib.metadata.entry_points(group="pytest11")
    assert [e.value for e in eps if e.name == "orkpy"] == ["orkpy.evaluation.pytest_plugin"]


def _args(shared):
    return ["-p", "no:cacheprovider", f"--orkpy-model={shared / ST / 'stories260K-Q4_0.gguf'}",
            f"--orkpy-reference={shared / ST / 'stories260K-F32.gguf'}",
            f"--orkpy-text={shared / 'text' / 'tinystories-val-B.txt'}", "--orkpy-ctx=128", "--orkpy-chunks=4",
            "--orkpy-threads=1"]


@pytest.mark.slow
def test_a_passing_and_a_failing_gate(pytester, shared):
    q8 = shared / ST / "stories260K-Q8_0.gguf"
    pytester.makepyfile(test_pass=USER_TEST.format(max_kl=1.0, q8=q8))
    r = pytester.runpytest_subprocess(*_args(shared), "-v")
    r.assert_outcomes(passed=2)
    pytester.makepyfile(test_pass=USER_TEST.format(max_kl=0.001, q8=q8))
    r = pytester.runpytest_subprocess(*_args(shared), "-v")
    r.assert_outcomes(passed=1, failed=1)
    out = r.stdout.str()
    assert "orkpy accuracy gate FAILED: " in out and "stories260K-Q4_0.gguf" in out
    assert re.search(r"mean KL +0\.\d{6} \+/- 0\.\d{6} +limit 0\.001", out)
    assert re.search(r"delta PPL +\+\d+\.\d{4} \(PPL [\d.]+ vs [\d.]+, \+[\d.]+ %\) +limit - / 50 %", out)
    assert re.search(r"same top +\d+\.\d\d %", out)
    assert re.search(r"worst chunks by mean KL: #\d 0\.\d{6} \(same top [\d.]+ %\), #\d", out)
    assert re.search(r"FAIL: mean KL 0\.\d{6} > 0\.001", out)
    assert "4 chunks of 128 tokens, 252 scored" in out
    assert "Traceback" not in out and "During handling" not in out   # a report, not a stack
    assert len(re.findall(r"^orkpy accuracy gate FAILED: ", out, re.M)) == 1   # the report once, not chained


def test_a_missing_option_fails_and_says_which(pytester):
    pytester.makepyfile(test_x="def test_g(orkpy_gate):\n    orkpy_gate(max_kl=0.1)\n")
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    r.assert_outcomes(errors=0, failed=1)
    assert "orkpy gate: no model: give --orkpy-model PATH" in r.stdout.str()


def test_options_are_listed_in_help(pytester):
    assert "--orkpy-reference=PATH" in pytester.runpytest_subprocess("--help").stdout.str()


# orkpy's own gate, through the plugin's fixture: Q8_0 as good as llama.cpp's own Q8_0 figure on this text
# (tests/test_ppl_gate.py: PPL 5.5732 against F32's 5.5642, +0.16 %)
@pytest.mark.gate
def test_q8_0_gate_through_the_plugin(orkpy_gate, shared):
    r = orkpy_gate(shared / ST / "stories260K-Q8_0.gguf", max_kl=0.002, max_dppl_rel=0.005, min_same_top=0.95,
                   reference=shared / ST / "stories260K-F32.gguf", text=shared / "text" / "tinystories-val-B.txt")
    assert r.result.chunks == 8 and "passed" in r.report
