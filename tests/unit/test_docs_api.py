"""The API pages (docs/api/<package>.md) against the code: every name a package exports in ``__all__`` (and,
for hybridblas, every member of the exported modules' ``__all__``) has an entry on its page, and every signature
written on a page (a ```python block holding one ``name(parameters)``) is the one ``inspect.signature`` gives
for that name now (annotations left out, and parameters whose names start with "_", which are not part of
the API), so the pages cannot go stale silently."""
import importlib
import inspect
import re
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hybridblas", "flapw", "cisolver")
_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _default(value):
    """A parameter's default as the pages write it: modules and classes by name, tuples element by element."""
    if isinstance(value, types.ModuleType) or inspect.isclass(value):
        return value.__name__
    if isinstance(value, tuple):
        inner = ", ".join(_default(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def signature_text(name, obj):
    """``name(parameters)`` without annotations or private (``_name``) parameters; None for an object without a
    signature (a constant)."""
    if not callable(obj):
        return None
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = [p for p in sig.parameters.values() if not p.name.startswith("_")]
    if params and params[0].name == "self":                  # a method looked up on its class
        params = params[1:]
    parts, star = [], False
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.kind is p.VAR_POSITIONAL:
            star = True
            parts.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        else:
            parts.append(p.name if p.default is p.empty else f"{p.name}={_default(p.default)}")
        if p.kind is p.POSITIONAL_ONLY and (p is params[-1] or params[params.index(p) + 1].kind is not p.kind):
            parts.append("/")
    return f"{name}({', '.join(parts)})"


def exported(package):
    """(qualified name, object) for every name of ``package.__all__``, and for hybridblas the members of its
    exported modules as ``module.member``."""
    pkg = importlib.import_module(package)
    out = []
    for name in pkg.__all__:
        obj = getattr(pkg, name)
        out.append((name, obj))
        if isinstance(obj, types.ModuleType):
            out += [(f"{name}.{m}", getattr(obj, m)) for m in getattr(obj, "__all__", [])]
    return out


def resolve(package, dotted):
    obj = importlib.import_module(package)
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def page(package):
    return (ROOT / "docs" / "api" / f"{package}.md").read_text(encoding="utf-8")


def documented_signatures(text):
    """{name: signature as written, whitespace made single} of the page's ```python blocks."""
    found = {}
    for block in _BLOCK.findall(text):
        sig = " ".join(block.split())
        assert sig, "an empty ```python block"
        name = sig.split("(", 1)[0]
        assert name not in found, f"{name} has two signature blocks"
        found[name] = sig
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_has_an_entry(package):
    text = page(package)
    documented = documented_signatures(text)
    missing = []
    for name, obj in exported(package):
        want = signature_text(name, obj)
        if want is not None and name not in documented:
            missing.append(f"{name}: no signature block (want {want})")
        elif want is None and not re.search(rf"^#+ `{re.escape(name)}`", text, re.M):
            missing.append(f"{name}: no heading `{name}`")
    assert not missing, f"docs/api/{package}.md lacks:\n" + "\n".join(missing)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_written_signature_is_the_code_s(package):
    documented = documented_signatures(page(package))
    assert len(documented) >= 4                               # the blocks were found
    wrong = []
    for name, written in documented.items():
        try:
            want = signature_text(name, resolve(package, name))
        except AttributeError:
            wrong.append(f"{name}: not in {package}")
            continue
        if written != want:
            wrong.append(f"{name}:\n  page: {written}\n  code: {want}")
    assert not wrong, f"docs/api/{package}.md is out of date:\n" + "\n".join(wrong)


def test_signature_text_reads_what_the_pages_write():
    def f(a, b=(KeyError,), *args, c=None, _private=None, **kw):
        pass

    def g(x, /, y, *, z=1):
        pass

    class K:
        def m(self, p, q=3):
            pass

        @classmethod
        def n(cls, r):
            pass

    assert signature_text("f", f) == "f(a, b=(KeyError,), *args, c=None, **kw)"
    assert signature_text("g", g) == "g(x, /, y, *, z=1)"
    assert signature_text("K.m", K.m) == "K.m(p, q=3)"
    assert signature_text("K.n", K.n) == "K.n(r)"
    assert signature_text("PI", 3.14) is None
    assert documented_signatures("```python\nf(a,\n  b=1)\n```\ntext\n```python\ng()\n```") == \
        {"f": "f(a, b=1)", "g": "g()"}
