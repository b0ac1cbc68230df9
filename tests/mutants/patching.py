"""Real-code mutants' patching: a one-line patch of a copy of an installed module, executed into a
fresh module object (the installed package and its entry in sys.modules stay untouched); a patch
whose line no longer reads as expected raises, naming it."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import linecache
import sys
import textwrap
import types


@functools.lru_cache(maxsize=None)
def patched_module(module: str, line: int, old: str, new: str) -> types.ModuleType:
    """A fresh copy of `module` whose line `line` (1-based) is `old` (stripped) and becomes `new`,
    same indentation."""
    original = importlib.import_module(module)  # imported as it is first: the copy is put back after
    spec = importlib.util.find_spec(module)
    lines = open(spec.origin).read().splitlines(keepends=True)
    got = lines[line - 1]
    if got.strip() != old:
        raise ValueError(f"{spec.origin}:{line} reads {got.strip()!r}, not {old!r}: the mutant is for another "
                         f"version of {module.split('.')[0]}")
    lines[line - 1] = got[:len(got) - len(got.lstrip())] + new + "\n"
    filename = f"{spec.origin} (mutant: line {line})"
    linecache.cache[filename] = (0, None, lines, filename)  # tracebacks and inspect show the mutant's line
    copy = types.ModuleType(module)
    copy.__file__, copy.__package__ = spec.origin, spec.parent
    # Registered while it executes (its dataclasses look their module up), then the original back.
    sys.modules[module] = copy
    try:
        exec(compile("".join(lines), filename, "exec"), copy.__dict__)
    finally:
        sys.modules[module] = original
    return copy


def patched_method(module: str, cls: str, method: str, line: int, old: str, new: str) -> type:
    """A subclass of the installed `module.cls` whose `method` is the patched copy's, run with the
    installed module's globals: the module's other classes stay the ones the rest of the package
    uses."""
    original = importlib.import_module(module)
    f = inspect.getattr_static(getattr(patched_module(module, line, old, new), cls), method)
    return type(cls, (getattr(original, cls),), {method: rebound(f, original.__dict__)})


def patched_function(module: str, qualname: str, line: int, old: str, new: str):
    """A function of `module` (`qualname`, e.g. "Class.method") compiled from its source with line
    `line` (1-based, of the file) patched, in the installed module's globals: for a module that
    cannot be executed twice (it registers torch ops at import). It must not use super() without
    arguments (compiled outside its class)."""
    original = importlib.import_module(module)
    target = original
    for part in qualname.split("."):
        target = getattr(target, part)
    target = inspect.unwrap(target)
    source, first = inspect.getsourcelines(target)
    got = source[line - first]
    if got.strip() != old:
        raise ValueError(f"{original.__file__}:{line} reads {got.strip()!r}, not {old!r}: the mutant is for another "
                         f"version of {module.split('.')[0]}")
    source[line - first] = got[:len(got) - len(got.lstrip())] + new + "\n"
    filename = f"{original.__file__} (mutant: line {line})"
    # Blank lines before it keep the file's line numbers in tracebacks.
    text = "\n" * (first - 1) + textwrap.dedent("".join(source))
    linecache.cache[filename] = (0, None, text.splitlines(keepends=True), filename)
    scope: dict = {}
    exec(compile(text, filename, "exec"), dict(original.__dict__), scope)
    return scope[target.__name__]


def rebound(f, globals_: dict, **names):
    """Function `f` run with `globals_`, `names` in them replaced."""
    return types.FunctionType(f.__code__, dict(globals_, **names) if names else globals_, f.__name__,
                              f.__defaults__, f.__closure__)
