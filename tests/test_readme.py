"""Every ```python block of README.md and docs/api.md (the API by topic, moved out of the README) runs
as pasted (tests/test_newcomer.py runs them in the interactive interpreter too).

Each block is extracted in order and run alone in a fresh interpreter
(``python -c``): no namespace is shared between blocks, so each one carries
its own imports. The working directory is the repository root, data come
from ``../shared`` (skipped with a reason when it is absent, as the other
data tests) or from files the block writes itself; ``TMPDIR`` points at the
test's own temporary directory, so whatever a block writes with
``tempfile`` is cleaned up by pytest. A block fails on an exception or a
false ``assert``.

Shell commands (the indented command listings and any ```sh / ```bash /
```console block) are not executed here; the CLI and CI tests cover them.
"""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

README = ROOT / "README.md"
#: the documents whose python blocks run as pasted
RUN_AS_PASTED = [README, ROOT / "docs" / "api.md"]
SHELL_LANGS = {"sh", "bash", "console", "shell", "text"}
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)


def fenced_blocks(text):
    """(language, code, heading) of every fenced block, in order; heading is the
    nearest Markdown heading above the block."""
    out = []
    for m in _FENCE.finditer(text):
        heads = re.findall(r"^#+ +(.+)$", text[: m.start()], re.M)
        out.append((m.group(1).strip(), m.group(2), heads[-1] if heads else "top"))
    return out


BLOCKS = [(code, f"{doc.name}: {head}") for doc in RUN_AS_PASTED
          for lang, code, head in fenced_blocks(doc.read_text(encoding="utf-8")) if lang == "python"]


def _id(i):
    return f"{i}-" + re.sub(r"[^a-z0-9]+", "-", BLOCKS[i][1].lower()).strip("-")[:40]


def test_readme_has_python_blocks_and_no_other_code_fences():
    assert len(BLOCKS) >= 9
    for doc in RUN_AS_PASTED:
        blocks = fenced_blocks(doc.read_text(encoding="utf-8"))
        assert any(lang == "python" for lang, _, _ in blocks), doc.name
        untested = [(lang, head) for lang, _, head in blocks if lang != "python" and lang not in SHELL_LANGS]
        assert not untested, f"{doc.name}: fenced blocks that this test would not execute: {untested}"


def test_readme_is_short_and_links_the_pages_its_details_moved_to():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 120
    for page in ("docs/api.md", "docs/cli.md", "docs/develop.md", "docs/server.md", "docs/recipes.md",
                 "docs/results/"):
        assert f"]({page})" in text, page


def test_readme_names_no_placeholder_files():
    for code, head in BLOCKS:
        for placeholder in ("model-Q4_K_M.gguf", "model-F16.gguf", "hf_dir/", '"model.gguf"'):
            assert placeholder not in code, (head, placeholder)


@pytest.mark.parametrize("i", range(len(BLOCKS)), ids=_id)
def test_readme_block_runs(i, tmp_path):
    if not (ROOT.parent / "shared").is_dir():
        pytest.skip(f"the README's examples read ../shared, not found at {ROOT.parent / 'shared'}")
    code, head = BLOCKS[i]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, f"README block {i} ({head}) failed:\n{code}\n--- stderr ---\n{p.stderr[-3000:]}"


def test_block_extraction_finds_a_failing_block():
    # the extraction and the runner see a broken snippet as broken (the test above can fail)
    (lang, code, head), = fenced_blocks("# H\n\n```python\nimport orkpy\nassert orkpy.quantize is None\n```\n")
    assert (lang, head) == ("python", "H")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "AssertionError" in p.stderr
