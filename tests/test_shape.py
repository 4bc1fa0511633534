"""The code keeps a readable shape: no Python file of orkpy/ (subpackages included) over 700 lines, no
function or method over 120 lines (its def line to its last line, docstring and nested functions included),
and no binding file (csrc/py/*.c) over 900 lines.

    python3 tests/test_shape.py        # the longest files and functions now
"""
import ast
import os
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "orkpy")
MAX_FILE, MAX_FUNCTION, MAX_BINDING = 700, 120, 900

#: files allowed past the limits, each with its reason (none today)
EXEMPT: dict = {}


def python_files(pkg=PKG):
    """Every .py file under ``pkg``, as paths relative to the repository root, sorted."""
    out = []
    for root, dirs, files in os.walk(pkg):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out += [os.path.relpath(os.path.join(root, f), ROOT).replace(os.sep, "/") for f in files if f.endswith(".py")]
    return sorted(out)


def _lines(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read().count("\n")


def functions(path):
    """(lines, qualified name) of every function and method in ``path``."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out.append((child.end_lineno - child.lineno + 1, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def test_no_python_file_over_700_lines():
    long = {p: n for p in python_files() if p not in EXEMPT and (n := _lines(p)) > MAX_FILE}
    assert not long, f"files over {MAX_FILE} lines (split them): {long}"


def test_no_function_over_120_lines():
    long = [f"{p}:{name} ({n} lines)" for p in python_files() if p not in EXEMPT
            for n, name in functions(p) if n > MAX_FUNCTION]
    assert not long, f"functions over {MAX_FUNCTION} lines (split them): {long}"


def test_no_binding_file_over_900_lines():
    folder = os.path.join(ROOT, "csrc", "py")
    long = {f: n for f in sorted(os.listdir(folder)) if f.endswith(".c")
            and (n := _lines(os.path.join("csrc", "py", f))) > MAX_BINDING}
    assert not long, f"csrc/py files over {MAX_BINDING} lines: {long}"


def test_the_walk_sees_subpackages_and_methods(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.py").write_text("class A:\n    def f(self):\n        def g():\n            pass\n"
                                            "        return g\n")
    assert [os.path.basename(p) for p in python_files(str(tmp_path))] == ["m.py"]
    assert functions(os.path.join(str(tmp_path), "sub", "m.py")) == [(4, "A.f"), (2, "A.f.g")]
    assert "orkpy/cli/__init__.py" in python_files() and "orkpy/runtime/tokenizer/vocabulary.py" in python_files()


def main():
    files = sorted(((_lines(p), p) for p in python_files()), reverse=True)
    funcs = sorted(((n, f"{p}:{name}") for p in python_files() for n, name in functions(p)), reverse=True)
    print("longest files:", *(f"  {n:5d}  {p}" for n, p in files[:8]), sep="\n")
    print("longest functions:", *(f"  {n:5d}  {q}" for n, q in funcs[:12]), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
