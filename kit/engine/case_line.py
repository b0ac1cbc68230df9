"""A case as one line of Python, `Case("name", mode=ForwardMode.DECODE, prefix=(3, 0), heads=GQA, ...)`:
a catalog file's `C("name", prefix=(3, 0), heads=GQA, ...)` line with `Case` and its mode written
out (a recurrent case's line is `RecurrentCase(...)`, as cases/linear.py writes it). Printed for a case
that is in no catalog (a fuzzed one), every field that differs from its default as a literal, so that it
can be pasted into `cases/<mode>.py` (cases/linear.py), and read back (`python -m
kit run --case-line`). Reading evaluates nothing: only literals, `ForwardMode.<MODE>` and the
named values of kit.engine.case.PRESETS (the head presets, DeepSeek's MLA constants)."""
from __future__ import annotations

import ast
import dataclasses
import json

from kit.engine.case import PRESETS, Case
from kit.engine.kinds.recurrent import RecurrentCase
from kit.modes import ForwardMode

CASE_TYPES = {cls.__name__: cls for cls in (Case, RecurrentCase)}  # what a line may build


def format_case(case) -> str:
    """The line: name and mode, then every field that differs from its default, in field order."""
    parts = [_literal(case.name), f"mode=ForwardMode.{case.mode.name}"]
    for field in dataclasses.fields(case):
        if field.name in ("name", "mode"):
            continue
        value = getattr(case, field.name)
        if field.default is dataclasses.MISSING or value != field.default:
            parts.append(f"{field.name}={_literal(value)}")
    return f"{type(case).__name__}({', '.join(parts)})"


def _literal(value) -> str:
    """repr, with strings in double quotes (as the catalog writes them; a shell's single quotes
    then hold the whole line)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_literal(v) for v in value)
        return f"({inner},)" if isinstance(value, tuple) and len(value) == 1 else \
            f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return repr(value)


def _value(node: ast.AST):
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ForwardMode":
        try:
            return ForwardMode[node.attr]
        except KeyError:
            raise ValueError(f"no ForwardMode.{node.attr}; known: {', '.join(m.name for m in ForwardMode)}") from None
    if isinstance(node, ast.Name) and node.id in PRESETS:
        return PRESETS[node.id]
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ValueError(f"{ast.unparse(node)!r} is not a literal, ForwardMode.<MODE> or a named value "
                         f"({', '.join(PRESETS)})") from None


def parse_case(text: str) -> Case:
    """The Case a line describes (validated as every case is), or ValueError naming the problem."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not a Case(...) line: {exc.msg}") from None
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in CASE_TYPES):
        raise ValueError("not a Case(...) line: write it as `python -m kit fuzz` prints it, "
                         "Case(\"name\", mode=ForwardMode.DECODE, prefix=(...), ...) or RecurrentCase(...)")
    if any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
        raise ValueError("Case(...) line: no * or ** arguments")
    args = [_value(a) for a in call.args]
    kwargs = {k.arg: _value(k.value) for k in call.keywords}
    try:
        return CASE_TYPES[call.func.id](*args, **kwargs)
    except TypeError as exc:
        raise ValueError(f"Case(...) line: {exc}") from None
