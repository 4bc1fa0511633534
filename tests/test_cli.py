import json
import os
import subprocess
import sys

import orkpy
import pytest
from orkpy.cli import main


def test_info_json(capsys):
    assert main(["info", "--json"]) == 0
    caps = json.loads(capsys.readouterr().out)
    assert caps["isa"] in caps["available"]
    # the ISA's quant table; under AVX2, its AVX-512 variant where the CPU has AVX-512 (quant_ref.c)
    want = "avx512" if caps["isa"] == "avx2" and caps["cpu_features"]["avx512"] else caps["isa"]
    assert caps["quant_kernels"] == want
    assert caps["gemm_f32_kernels"] == want  # the float32 GEMM picks its AVX-512 tile the same way


def test_no_avx512_env_keeps_the_plain_avx2_quant_table():
    code = "import orkpy; c = orkpy.capabilities(); print(c['isa'], c['quant_kernels'], c['gemm_f32_kernels'])"
    env = dict(os.environ, ORKPY_NO_AVX512="1")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    isa, quant, gemm = p.stdout.split()
    assert quant == isa and gemm == isa


def test_info_text_via_module():
    p = subprocess.run([sys.executable, "-m", "orkpy", "info"], capture_output=True, text=True)
    assert p.returncode == 0
    assert "kernels in use" in p.stdout


def test_force_scalar_env():
    code = "import orkpy; c = orkpy.capabilities(); print(c['isa'], c['forced_scalar'])"
    env = dict(os.environ, ORKPY_FORCE_SCALAR="1")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert p.stdout.split() == ["scalar", "True"]


def test_quant_report_json(capsys):
    assert main(["quant-report", "--rows", "64", "--cols", "1024", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    errs = {(e["weight"], e["kind"]): e["rms"] for e in rep["errors"]}
    assert set(errs) == {(w, k) for w in ("gaussian", "heavy-tailed") for k in orkpy.KINDS}
    assert errs[("gaussian", "int8")] < errs[("gaussian", "nf4")] < errs[("gaussian", "int4")]
    assert rep["nf4_over_int4"]["gaussian"] < 0.75


def test_cli_bad_argument_is_an_error_not_a_crash(capsys):
    with pytest.raises(SystemExit) as e:
        main(["quant-report", "--rows", "0"])
    assert e.value.code == 2
