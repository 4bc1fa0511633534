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


def _modules(pkg):
    """{dotted name below the package ('runtime.model', 'cli', '__init__'): file path} for every .py
    file of the package and its subpackages (a package is named by its folder, its __init__.py
    included; the top package's __init__ is '__init__')."""
    out = {}
    for root, dirs, files in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(root, pkg)
        prefix = "" if rel == "." else rel.replace(os.sep, ".") + "."
        for f in sorted(files):
            if f.endswith(".py"):
                name = f[:-3]
                if name == "__init__":
                    out[prefix[:-1] or "__init__"] = os.path.join(root, f)
                else:
                    out[prefix + name] = os.path.join(root, f)
    return out


def _resolve(names, dotted):
    """The longest module of ``names`` that ``dotted`` (a name below the package) is or lies in."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        cand = ".".join(parts[:i])
        if cand in names:
            return cand
    return parts[0]


def _target(mod, node, modules, is_pkg=False):
    """The orkpy modules an import node of module ``mod`` names (dotted below the package:
    'runtime.model', '_core')."""
    out = set()
    if isinstance(node, ast.Import):
        for a in node.names:
            parts = a.name.split(".")
            if parts[0] == "orkpy" and len(parts) > 1:
                out.add(_resolve(modules, ".".join(parts[1:])))
        return out
    if node.level == 0:
        parts = (node.module or "").split(".")
        if parts[0] != "orkpy":
            return out
        base = parts[1:]
    else:
        here = [] if mod == "__init__" else mod.split(".")
        pkg = here if is_pkg else here[:-1]
        if node.level - 1 > len(pkg):
            raise AssertionError(f"orkpy/{mod}: a relative import above the package")
        base = pkg[: len(pkg) - (node.level - 1)] + (node.module.split(".") if node.module else [])
    for a in node.names:  # from .pkg import a, b: submodules, or names the package defines
        full = ".".join(base + [a.name])
        out.add(full if full in modules else (_resolve(modules, ".".join(base)) if base else "__init__"))
    return out


def import_graph(pkg=PKG):
    """{module: set of the orkpy modules it imports} for every module of orkpy/ (dotted below
    the package) and the C extension."""
    files = _modules(pkg)
    modules = set(files) | {"_core"}
    graph = {m: set() for m in files}
    for m, path in files.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        is_pkg = path.endswith("__init__.py")
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[m] |= _target(m, node, modules, is_pkg) - {m}
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
    on objects other than self / cls])} for every orkpy/*.py; private: one leading underscore."""
    out = {}
    for m, path in _modules(pkg).items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=path)
        own, used = set(), []
        for node in ast.walk(tree):
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
        bad += [f"orkpy/{m.replace('.', '/')}.py:{line}: .{attr}" for line, attr in used if attr in others]
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


def test_subpackage_files_are_modules_of_their_own(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    from .sub.x import main\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("from .y import g\n")
    (tmp_path / "sub" / "x.py").write_text("from . import y\nfrom .. import a\nfrom .._core import E\n")
    (tmp_path / "sub" / "y.py").write_text("import orkpy.sub.x\n")
    g = import_graph(str(tmp_path))
    assert g == {"a": {"sub.x"}, "sub": {"sub.y"}, "sub.x": {"sub.y", "a", "_core"}, "sub.y": {"sub.x"}}
    assert cycles(g) == [["a", "sub.x", "sub.y"]]


#: the stage subpackages from the bottom up (docs/architecture.md "Layout"); the top-level modules
#: (_core, _typing, __init__, __main__) sit outside the order
LAYERS = ("kernels", "formats", "runtime", "quantization", "evaluation", "server", "cli")
#: imports that run up the stage order, each with its reason; nothing else may
UPWARD = {
}


def layer_of(mod):
    top = mod.split(".")[0]
    return LAYERS.index(top) if top in LAYERS else None


def upward_imports(graph):
    """[(module, imported module)] where a module imports one of a higher stage."""
    out = []
    for m in sorted(graph):
        for t in sorted(graph[m]):
            lm, lt = layer_of(m), layer_of(t)
            if lm is not None and lt is not None and lt > lm:
                out.append((m, t))
    return out


def test_stage_subpackages_import_downwards():
    """Every module lives in a stage subpackage (or is one of the package's own few files) and
    imports only its own stage or those below, except the listed, explained exceptions."""
    g = import_graph()
    loose = sorted(m for m in g if layer_of(m) is None and m not in ("__init__", "__main__", "_typing", "_io", "_mapped"))
    assert not loose, f"modules outside the stage subpackages {LAYERS}: {loose}"
    up = upward_imports(g)
    unlisted = [e for e in up if e not in UPWARD]
    assert not unlisted, f"imports up the stage order {LAYERS} that UPWARD does not explain: {unlisted}"
    stale = sorted(set(UPWARD) - set(up))
    assert not stale, f"UPWARD lists imports that no longer exist: {stale}"


def test_the_flat_module_paths_still_import():
    """Code written against the earlier flat layout (orkpy.model, orkpy.calibrate, ...) gets the
    same module objects."""
    import importlib
    import orkpy
    assert orkpy.MOVED, "orkpy.MOVED is empty"
    for old, sub in orkpy.MOVED.items():
        assert importlib.import_module(f"orkpy.{old}") is importlib.import_module(f"orkpy.{sub}.{old}"), old
    from orkpy.model import load_model  # noqa: F401  (a from-import of a flat path)
    assert orkpy.load_model is load_model


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
            print(f"{m:<24} -> {', '.join(sorted(g[m])) or '-'}")
        found = cycles(g)
        print("cycles: " + ("; ".join(" <-> ".join(c) for c in found) if found else "none"))
        up = upward_imports(g)
        print(f"imports up the stage order ({' < '.join(LAYERS)}): {len(up)}")
        for m, t in up:
            print(f"  {m} -> {t}: {UPWARD.get((m, t), 'NOT EXPLAINED')}")
    return 1 if cycles(g) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
