"""Triton's interpreter (TRITON_INTERPRET=1, the CPU runs) without its repeated set-up.

A kernel launch patches `triton.language` for the interpreter (`_patch_lang`) and puts it
back when the grid is done. Every call of a @triton.jit helper inside the kernel patches it
again, for every program of the grid, though nothing changes: the launch's patches are in
place until its end, and the helper's own are never put back. With helpers in a kernel's
inner loop that was 40% of a run's time. `install()` makes a helper's call skip it when the
kernel's launch has already patched the language modules the helper sees; any other call
patches as before. The kernels compute the same; only the redundant patching is gone.

It also looks up the numpy dtype of a Triton dtype once: the interpreter builds its whole table
of dtypes again at each lookup, several per operation of every program (7% of a run's time).

And it types a comparison's result int1. The interpreter labels it with the left operand's type
(int32, say) over boolean data; a scalar comparison splatted to a block is then materialised as
that integer type, `&` with a boolean block keeps it, and a load or store masked by it fails
with "mask has unsupported dtype" (SGLang's causal conv1d kernels mask so: `(coord < n) & ...`).

And it calls a kernel module's alias of a Triton builtin (`exp = tl.exp` at import, as SGLang's fla
ops bind it) as the interpreter's: the interpreter patches the language modules' attributes, not
their aliases, and an alias called in a kernel raises "Did you forget to add @triton.jit ?".

And it computes bfloat16 as a GPU does. The interpreter stores bfloat16 as its uint16 bits and
applies numpy's operators to those: bf16 * bf16 multiplied the integers (SGLang's causal conv1d
update, `x * w` over bf16 loads: NaN/inf outputs). Here the operands are widened to float32 and the
result narrowed back, rounded to nearest even, as every float32 -> bfloat16 conversion now is (the
interpreter's truncates: a bias every bf16 store carries into the next kernel).

And it casts to fp8 as a GPU does: rounded to nearest even, saturating at the format's largest
finite value. The interpreter's float downcast (`_convert_float`) rounds a tie up and ORs a
rounding's carry out of the mantissa into the exponent field, where it is lost when the exponent
is odd: 1.97 -> 1.0 in e4m3, 126.2 -> 64 (triton-lang/triton#8322). SGLang's Triton kernels cast
the query and the probabilities to an fp8 cache's dtype (`q.to(k.dtype)`, `p.to(v.dtype)`): under
the unpatched interpreter their outputs were 20-40% off.

`choose()` is where a process takes the interpreter at all, once, before Triton is imported.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import FrozenSet, List, Set

_launches: List[FrozenSet[int]] = []  # the language modules each unfinished launch patched (ids)
# Modules a helper's call patched: Triton never puts these back, and a later launch's restore
# puts back what it found, patched. (Class attributes a helper's call patches, of tl.tensor
# say, are put back by the launch's restore; every launch patches them again.)
_kept: Set[int] = set()


class TritonImportedFirst(RuntimeError):
    pass


def choose() -> None:
    """Without CUDA, Triton's interpreter for every Triton kernel of the process (TRITON_INTERPRET=1);
    with CUDA, or a TRITON_INTERPRET already set, nothing. Triton reads the variable when it defines
    a kernel, its own `tl` helpers (defined when triton is imported) included, so it is chosen before
    Triton's first import: by what runs backends (the pytest plugin, `python -m kit`) and by what
    defines kernels (our Triton backend's kernels, the engines' set-up), never by a module's import.
    Raises TritonImportedFirst where Triton was imported without it."""
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch

    if torch.cuda.is_available():
        return
    if "triton" in sys.modules:
        raise TritonImportedFirst(
            "triton was imported before Triton's interpreter was chosen (no CUDA here): its own helpers are then "
            "not interpretable; set TRITON_INTERPRET=1, or call kit.harness.interpreter.choose() before importing "
            "triton")
    os.environ["TRITON_INTERPRET"] = "1"


class _NothingToRestore:
    def restore(self) -> None:
        pass


def _langs(fn, tl) -> FrozenSet[int]:
    """The language modules `_patch_lang(fn)` patches: the ones fn's globals name (as Triton finds them)."""
    core = tl.core
    return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is core)


def _patch_once(patch_lang, tl):
    def patch(fn):
        langs = _langs(fn, tl)
        if _launches:  # a helper's call inside a launch
            if langs and langs <= _launches[-1] | _kept:
                return _NothingToRestore()
            scope = patch_lang(fn)  # patched as before, and never put back (Triton drops the scope)
            _kept.update(langs)
            return scope
        scope = patch_lang(fn)
        _launches.append(langs)
        restore = scope.restore

        def restore_and_end():
            _launches.pop()
            restore()
        scope.restore = restore_and_end
        return scope
    patch.__wrapped__ = patch_lang
    return patch


class _GlobalsOf:
    """A function's module globals as attributes, for the interpreter's attribute patching."""

    def __init__(self, namespace: dict):
        object.__setattr__(self, "_namespace", namespace)

    def __getattr__(self, name):
        try:
            return self._namespace[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self._namespace[name] = value


def _aliases_patched(patch_lang, patch_alias, is_builtin):
    """`patch_lang(fn)`, with fn's module's aliases of builtins patched first, once per module and
    for good: they are called only inside kernels, and every kernel runs in the interpreter."""
    done: Set[int] = set()

    def patch(fn):
        namespace = fn.__globals__
        if id(namespace) not in done:
            done.add(id(namespace))
            for name, value in list(namespace.items()):
                if is_builtin(value):
                    patch_alias(_GlobalsOf(namespace), name, value)
        return patch_lang(fn)
    patch.__wrapped__ = patch_lang
    return patch


def _np_dtype_once(get_np_dtype, tl):
    """`get_np_dtype(t)`, remembered per scalar type: a block's is its element type's. Pointer
    types are not hashable; those are looked up every time."""
    known = {}

    def np_dtype(tt_dtype):
        key = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if key.__hash__ is None:
            return get_np_dtype(tt_dtype)
        try:
            return known[key]
        except KeyError:
            known[key] = found = get_np_dtype(tt_dtype)
            return found
    np_dtype.__wrapped__ = get_np_dtype
    return np_dtype


def _typed_int1(compare, tl, handle_cls):
    def typed(self, lhs, rhs):
        found = compare(self, lhs, rhs)
        return handle_cls(found.data.astype(bool, copy=False), tl.int1)
    typed.__wrapped__ = compare
    return typed


def _comparisons_typed_int1(builder_cls, handle_cls, tl) -> None:
    for name in dir(builder_cls):
        if name.startswith(("create_icmp", "create_fcmp")):
            setattr(builder_cls, name, _typed_int1(getattr(builder_cls, name), tl, handle_cls))


def _bf16_in_float32(op_impl, tl, handle_cls):
    """`op_impl(self, *operands, op)` over float32 copies of bfloat16 operands, a float result back in bfloat16."""
    def computed(self, *args):
        operands, op = args[:-1], args[-1]
        if not any(h.dtype.scalar == tl.bfloat16 for h in operands):
            return op_impl(self, *args)
        widened = [self.create_fp_ext(h, tl.float32) if h.dtype.scalar == tl.bfloat16 else h for h in operands]
        found = op_impl(self, *widened, op)
        if found.data.dtype.kind != "f":  # a comparison's booleans
            return found
        return self.create_fp_trunc(handle_cls(found.data, tl.float32), tl.bfloat16)
    computed.__wrapped__ = op_impl
    return computed


def _bf16_bits_rounded_to_nearest_even(np, values):
    """float32 values as bfloat16 bits, rounded to nearest even (NaN kept NaN), as a GPU converts."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def _bf16_rounded_to_nearest(fp_trunc, tl, handle_cls):
    """float32 -> bfloat16 rounded to nearest even: the interpreter's conversion truncates (and its
    RTNE mode rounds half up)."""
    import numpy as np

    def trunc(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return handle_cls(_bf16_bits_rounded_to_nearest_even(np, src.data), dst_type.scalar)
        return fp_trunc(self, src, dst_type)
    trunc.__wrapped__ = fp_trunc
    return trunc


def _fp8_rounded_to_nearest(fp_to_fp, tl, handle_cls):
    """float32/float16/bfloat16 -> fp8 e4m3 / e5m2 rounded to nearest even, saturating (NVIDIA's
    cvt.rn.satfinite), through torch's casts; other conversions, and other rounding modes, the
    interpreter's."""
    import numpy as np
    import torch

    from triton._C.libtriton import ir

    sources = {tl.float32: (np.int32, torch.float32), tl.float16: (np.int16, torch.float16),
               tl.bfloat16: (np.int16, torch.bfloat16)}
    targets = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}

    def convert(self, src, dst_type, rounding_mode):
        source, target = sources.get(src.dtype.scalar), targets.get(dst_type.scalar)
        if source is None or target is None or rounding_mode != ir.ROUNDING_MODE.RTNE:
            return fp_to_fp(self, src, dst_type, rounding_mode)
        bits, dtype = source
        values = torch.from_numpy(np.ascontiguousarray(src.data).view(bits)).view(dtype)
        largest = torch.finfo(target).max
        stored = values.float().clamp(-largest, largest).to(target)  # float32 holds every source value
        return handle_cls(stored.view(torch.uint8).numpy(), dst_type.scalar)
    convert.__wrapped__ = fp_to_fp
    return convert


def _bf16_as_the_gpu(builder_cls, handle_cls, tl) -> None:
    builder_cls.create_fp_trunc = _bf16_rounded_to_nearest(builder_cls.create_fp_trunc, tl, handle_cls)
    for name in ("binary_op", "unary_op"):
        setattr(builder_cls, name, _bf16_in_float32(getattr(builder_cls, name), tl, handle_cls))


def install() -> bool:
    """Once per process, when Triton's interpreter is loaded or to be used, and shaped as this expects
    (a module-level `_patch_lang(fn)` returning a scope with `restore()`, `_get_np_dtype(t)`, and
    an `InterpreterBuilder` whose `create_icmp*`/`create_fcmp*` return a `TensorHandle`);
    True if in place."""
    interp = sys.modules.get("triton.runtime.interpreter")
    if interp is None and os.environ.get("TRITON_INTERPRET") == "1":
        # Triton loads it at the first kernel's definition, which for SGLang's kernels comes later:
        # inside a backend's construction.
        interp = importlib.import_module("triton.runtime.interpreter")
    original = getattr(interp, "_patch_lang", None)
    if original is None:
        return False
    if hasattr(original, "__wrapped__"):
        return True  # installed
    import triton.language as tl
    interp._patch_lang = _patch_once(original, tl)
    if hasattr(interp, "_patch_attr") and hasattr(interp, "_LangPatchScope"):
        def patch_alias(namespace, name, builtin):
            interp._patch_attr(namespace, name, builtin, interp.interpreter_builder, interp._LangPatchScope())
        # Outside the once-per-launch skip: a helper's module has aliases of its own.
        interp._patch_lang = _aliases_patched(interp._patch_lang, patch_alias, tl.core.is_builtin)
    if hasattr(interp, "_get_np_dtype"):
        interp._get_np_dtype = _np_dtype_once(interp._get_np_dtype, tl)
    if hasattr(interp, "InterpreterBuilder") and hasattr(interp, "TensorHandle"):
        _comparisons_typed_int1(interp.InterpreterBuilder, interp.TensorHandle, tl)
        _bf16_as_the_gpu(interp.InterpreterBuilder, interp.TensorHandle, tl)
        interp.InterpreterBuilder.create_fp_to_fp = _fp8_rounded_to_nearest(
            interp.InterpreterBuilder.create_fp_to_fp, tl, interp.TensorHandle)
    return True
