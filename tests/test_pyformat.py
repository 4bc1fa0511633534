"""Every format string the C sources hand to CPython's own formatter (PyErr_Format,
PyUnicode_FromFormat and the like) uses only conversions that formatter has on every supported
CPython (>= 3.10, pyproject.toml).

CPython's formatter is not printf: it has no float conversions (%g, %f, %e), and before 3.12 an
unknown conversion copies the rest of the format string as it is (the value is silently lost: the
error read "'norm_eps' = %g is not a finite float32"), while 3.12+ raises SystemError instead of the
error meant. The '-' flag, '*' widths, %T, %N, %o, %X and the j / t modifiers are 3.12+ only. A
float goes into a message formatted in C first (snprintf) or as a Python float (%R / %S).

The accepted set is the table of the PyUnicode_FromFormat documentation for CPython 3.10 / 3.11: %%,
%c, %d, %i, %u, %x, %ld, %li, %lu, %lld, %lli, %llu, %zd, %zi, %zu, %s, %p, %A, %U, %V, %S, %R, with
an optional '0' flag, a decimal width and a decimal precision."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(p for p in (ROOT / "csrc").rglob("*") if p.suffix in (".c", ".h"))

#: CPython's formatting functions -> the index of the format argument
FORMATTERS = {
    "PyErr_Format": 1, "PyErr_FormatV": 1, "PyUnicode_FromFormat": 0, "PyUnicode_FromFormatV": 0,
    "PyBytes_FromFormat": 0, "PyBytes_FromFormatV": 0, "PyErr_WarnFormat": 2, "PyErr_ResourceWarning": 2,
    "PyErr_FormatUnraisable": 0, "PyErr_WarnExplicitFormat": 5, "_PyErr_Format": 2,
}
CALL = re.compile(r"\b(" + "|".join(FORMATTERS) + r")\s*\(")
SPEC = re.compile(r"%(?:%|0?\d*(?:\.\d+)?(?:l{1,2}[diu]|z[diu]|[cdiuxspAUVSR]))")


def strip_comments(src):
    """The source with comments blanked (kept length and lines), string and char literals intact."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def call_args(src, start):
    """The top-level argument texts of the call whose '(' is at start."""
    args, depth, i, cur = [], 0, start, []
    while i < len(src):
        c = src[i]
        if c in "\"'":
            j = i + 1
            while src[j] != c:
                j += 2 if src[j] == "\\" else 1
            cur.append(src[i:j + 1])
            i = j + 1
            continue
        if c in "([{":
            depth += 1
            if depth == 1:
                i += 1
                continue
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append("".join(cur))
                return args
        elif c == "," and depth == 1:
            args.append("".join(cur))
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    raise ValueError("unbalanced call")


def literal(arg):
    """The C string of a format argument made only of adjacent string literals, else None."""
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', arg)
    if not parts or re.sub(r'"(?:[^"\\]|\\.)*"', "", arg).strip():
        return None
    return "".join(parts).replace("\\\\", "\x00").replace("\\%", "%")


def bad_specs(fmt):
    """The conversions of fmt CPython's formatter does not have on 3.10+."""
    bad, i = [], 0
    while True:
        i = fmt.find("%", i)
        if i < 0:
            return bad
        m = SPEC.match(fmt, i)
        if m:
            i = m.end()
        else:
            bad.append(re.match(r"%[-+ #0-9.*]*[a-zA-Z]{0,3}", fmt[i:]).group(0) or fmt[i:i + 2])
            i += 1


def format_calls():
    for p in SOURCES:
        src = strip_comments(p.read_text(encoding="utf-8"))
        for m in CALL.finditer(src):
            line = src.count("\n", 0, m.start()) + 1
            args = call_args(src, m.end() - 1)
            yield f"{p.relative_to(ROOT)}:{line} {m.group(1)}", args[FORMATTERS[m.group(1)]]


def test_scanner_sees_the_calls_and_the_bad_conversions():
    calls = list(format_calls())
    assert len(calls) > 100                      # the bindings raise with PyErr_Format everywhere
    assert bad_specs("'%s' = %g is not finite %zu%%") == ["%g"]
    assert bad_specs("%-5s %*d %lx %.3f %T %zx") == ["%-5s", "%*d", "%lx", "%.3f", "%T", "%zx"]
    assert bad_specs("%.200s %03i %llu %zd %R %U %V %A %p %c %x") == []
    assert literal('"a %s" "b %d"') == "a %sb %d" and literal("fmt") is None


def test_cpython_format_strings_use_only_supported_conversions():
    bad = []
    for where, arg in format_calls():
        fmt = literal(arg)
        if fmt is None:
            bad.append(f"{where}: the format is not a string literal: {arg.strip()}")
        elif bad_specs(fmt):
            bad.append(f"{where}: {bad_specs(fmt)} in {fmt!r}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("fmt", ["%g", "%f", "%.3e"])
def test_cpython_has_no_float_conversion(fmt):
    """Why: the conversion is not formatted (3.10 / 3.11 copy it as it is; 3.12+ raise SystemError)."""
    ctypes = pytest.importorskip("ctypes")
    f = ctypes.pythonapi.PyUnicode_FromFormat
    f.restype = ctypes.py_object
    f.argtypes = [ctypes.c_char_p, ctypes.c_double]
    try:
        text = f(fmt.encode(), 1.5)
    except SystemError:
        return
    assert "1.5" not in text
