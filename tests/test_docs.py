"""The repository's own docs stand alone: no source, doc or test points to a
document outside the repository (../shared holds data: models, texts, captured
streams, read by the tests through the ``shared`` fixture), and every relative
link in README.md and docs/*.md names a file of the repository."""
import re

from cbuild import ROOT

TREES = ["README.md", "docs", "csrc", "orkpy", "bench", "tests", "notebooks", "setup.py", "buildflags.py", ".ci"]
OUTSIDE = re.compile(r"shared/docs|(npu|quant|style)-anchors")


def _files():
    for t in TREES:
        p = ROOT / t
        for f in ([p] if p.is_file() else sorted(p.rglob("*"))):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".o", ".so", ".pyc"):
                yield f


def test_no_reference_to_documents_outside_the_repository():
    me = __file__.rsplit("/", 1)[-1]
    hits = []
    for f in _files():
        if f.name == me or "corpus" in f.parts:
            continue
        text = f.read_text(errors="replace")
        hits += [f"{f.relative_to(ROOT)}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                 if OUTSIDE.search(line)]
    assert not hits, "\n".join(hits)


def test_relative_links_in_the_docs_resolve():
    bad = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):
                continue
            if not (md.parent / path).exists():
                bad.append(f"{md.relative_to(ROOT)}: {target}")
    assert not bad, bad
