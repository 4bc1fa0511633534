"""The package's import graph has no cycles: every module of orkpy/ imports only modules
below it. Every import counts -- module level, inside a function, under ``if TYPE_CHECKING``.

Draw the graph (one line per module: what it imports), or as Graphviz DOT:

    python3 tests/test_architecture.py            # text
    python3 tests/test_architecture.py --dot      # | dot -Tsvg > imports.svg
"""
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "orkpy")


def _target(mod, node, modules, subpackage=False):
    """The orkpy modules an import node of module ``mod`` names (as short names: 'model', '_core');
    ``subpackage``: ``mod`` is a folder (orkpy/cli/), its relative imports one level deeper."""
    out = set()
    if isinstance(node, ast.Import):
        for a in node.names:
            parts = a.name.split(".")
            if parts[0] == "orkpy" and len(parts) > 1:
                out.add(parts[1])
        return out
    if node.level == 0:
        parts = (node.module or "").split(".")
        if parts[0] != "orkpy":
            return out
        rest = parts[1:]
    else:
        level = node.level - subpackage  # a subpackage's files count as the one module they form
        if level > 1:
            raise AssertionError(f"orkpy/{mod}: a relative import above the package")
        if level == 0:  # from .x import / from . import x in a subpackage: its own files
            return out
        rest = node.module.split(".") if node.module else []
    if rest:
        out.add(rest[0])
    else:  # from . import a, b: submodules, or names the package (__init__) defines
        out.update(a.name if a.name in modules else "__init__" for a in node.names)
    return out


def _sources(pkg=PKG):
    """{module: [its files]}: each orkpy/*.py is a module, and each subpackage (a folder with an __init__.py)
    is one module made of all its files."""
    out = {}
    for f in sorted(os.listdir(pkg)):
        path = os.path.join(pkg, f)
        if f.endswith(".py"):
            out[f[:-3]] = [path]
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            out[f] = sorted(os.path.join(path, g) for g in os.listdir(path) if g.endswith(".py"))
    return out


def _trees(paths):
    for path in paths:
        with open(path, encoding="utf-8") as f:
            yield ast.parse(f.read(), filename=path)


def import_graph(pkg=PKG):
    """{module: set of the orkpy modules it imports} for every orkpy/*.py, subpackage and the C extension."""
    sources = _sources(pkg)
    modules = set(sources) | {"_core"}
    graph = {m: set() for m in sources}
    for m, paths in sources.items():
        for tree in _trees(paths):
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    graph[m] |= _target(m, node, modules, subpackage=paths[0] != os.path.join(pkg, m + ".py")) - {m}
    return graph


def cycles(graph):
    """The strongly connected components with more than one module (each a cycle), sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, f"import cycles among orkpy modules (each group imports itself through the others): {found}"


def _private_attributes(pkg=PKG):
    """{module: (private attribute names it defines, [(line, name) of private attributes it reads
    on objects other than self / cls])} for every orkpy/*.py and subpackage; private: one leading underscore."""
    out = {}
    for m, paths in _sources(pkg).items():
        own, used = set(), []
        for node in (n for tree in _trees(paths) for n in ast.walk(tree)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if on_self and isinstance(node.ctx, ast.Store):
                    own.add(node.attr)
                elif not on_self:
                    used.append((node.lineno, node.attr))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                own.add(node.target.id)
        out[m] = (own, used)
    return out


def test_no_module_reaches_into_another_modules_objects():
    """The forward model is driven through Model's public methods (model._fwd, model._use_npu and
    device._upload_store from other modules are gone): no module reads a private attribute that
    only another orkpy module defines."""
    mods = _private_attributes()
    bad = []
    for m, (own, used) in mods.items():
        others = set().union(*(o for n, (o, _) in mods.items() if n != m)) - own
        bad += [f"orkpy/{m}:{line}: .{attr}" for line, attr in used if attr in others]
    assert not bad, f"private attributes of other modules' objects: {bad}"


def test_cycle_check_sees_function_level_imports(tmp_path):
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from . import a\n    from .c import y\n")
    (tmp_path / "c.py").write_text("import orkpy.b\n")
    g = import_graph(str(tmp_path))
    assert g == {"a": {"b"}, "b": {"a", "c"}, "c": {"b"}}
    assert cycles(g) == [["a", "b", "c"]]
    (tmp_path / "c.py").write_text("")
    (tmp_path / "b.py").write_text("from . import c\n")
    assert cycles(import_graph(str(tmp_path))) == []



def test_a_subpackage_is_one_module(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    from .cli import main\n")
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "__init__.py").write_text("from . import run\nfrom .run import go\n")
    (tmp_path / "cli" / "run.py").write_text("from ..a import f\nfrom .. import b\n")
    (tmp_path / "b.py").write_text("")
    g = import_graph(str(tmp_path))
    assert g == {"a": {"cli"}, "b": set(), "cli": {"a", "b"}}
    assert cycles(g) == [["a", "cli"]]

def main(argv):
    g = import_graph()
    if "--dot" in argv:
        print("digraph orkpy {\n  rankdir=BT;")
        for m in sorted(g):
            for t in sorted(g[m]):
                print(f'  "{m}" -> "{t}";')
        print("}")
    else:
        for m in sorted(g):
            print(f"{m:<12} -> {', '.join(sorted(g[m])) or '-'}")
        found = cycles(g)
        print("cycles: " + ("; ".join(" <-> ".join(c) for c in found) if found else "none"))
    return 1 if cycles(g) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
