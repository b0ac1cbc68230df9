"""Triton's interpreter patches its language once per launch (kit.harness.interpreter): the
kernels compute the same, and a helper seeing other language modules is still patched; a
comparison's result is typed int1, so a mask built from a scalar one loads; a module's alias of a
builtin is called as the interpreter's; bfloat16 arithmetic is computed on values, not on their bits;
a cast to fp8 rounds to nearest even, as a GPU's."""
import inspect
import subprocess
import sys
import types

import pytest
import torch

from tests import SUBPROCESS_TIMEOUT_S
from kit.harness import interpreter


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setattr(interpreter, "_launches", [])
    monkeypatch.setattr(interpreter, "_kept", set())


def _counting(calls):
    def patch_lang(fn):
        calls.append(fn.__name__)
        return types.SimpleNamespace(restore=lambda: calls.append("restore"))
    return patch_lang


def _fn(name, **modules):
    """A function whose globals name `modules`, as a kernel or helper module's would."""
    return types.FunctionType(compile("def f(): pass", name, "exec").co_consts[0], dict(modules), name)


def test_helpers_inside_a_launch_are_patched_only_for_modules_not_patched_yet(fresh_state):
    tl = types.ModuleType("tl")
    tl.core = types.ModuleType("core")
    calls = []
    patch = interpreter._patch_once(_counting(calls), tl)
    kernel, helper, core_helper = _fn("kernel", tl=tl), _fn("helper", tl=tl), _fn("core_helper", core=tl.core)
    for _ in range(2):  # two launches
        scope = patch(kernel)
        for _ in range(3):  # each program of the grid calls both helpers
            patch(helper)
            patch(core_helper)
        scope.restore()
    # The launch patches; its own modules' helpers never; `core`'s once, the first time (never put back).
    assert calls == ["kernel", "core_helper", "restore", "kernel", "restore"]
    assert interpreter._launches == []


def test_a_kernel_with_helpers_computes_the_same_with_the_language_patched_once(monkeypatch):
    from tests.toys.interpreted import row_sums
    import triton.language as tl
    from triton.runtime import interpreter as triton_interpreter
    if not hasattr(triton_interpreter, "GridExecutor"):
        pytest.skip("kernels are compiled here: the interpreter is not used")
    x = torch.randn(3, 10)
    expected = torch.where(x > 0, 2 * x, -x).sum(1)
    interpreter.install()
    original = inspect.unwrap(triton_interpreter._patch_lang)
    calls = []

    def counted(patch):
        def count(fn):
            calls.append(fn.__name__)
            return patch(fn)
        return count

    monkeypatch.setattr(triton_interpreter, "_patch_lang", counted(original))
    every_call = row_sums(x)
    per_launch = len(calls)
    calls.clear()
    monkeypatch.setattr(interpreter, "_launches", [])
    monkeypatch.setattr(triton_interpreter, "_patch_lang", interpreter._patch_once(counted(original), tl))
    once = row_sums(x)
    torch.testing.assert_close(every_call, expected)
    assert torch.equal(once, every_call)
    assert per_launch > 3 * 3 and calls.count("row_sums_kernel") == 1 and "_scaled" not in calls


def test_numpy_dtypes_are_the_interpreters_own():
    """The remembered lookup gives what the interpreter's own does, for scalars, blocks and pointers
    (not hashable: looked up each time), the first time and after."""
    import triton.language as tl
    from triton.runtime import interpreter as triton_interpreter
    original = getattr(triton_interpreter._get_np_dtype, "__wrapped__", triton_interpreter._get_np_dtype)
    once = interpreter._np_dtype_once(original, tl)
    scalars = [tl.int1, tl.int8, tl.int32, tl.int64, tl.float16, tl.bfloat16, tl.float32, tl.float8e5, tl.float8e4nv]
    kinds = (scalars + [tl.block_type(t, [4, 2]) for t in scalars]
             + [tl.pointer_type(tl.float16), tl.block_type(tl.pointer_type(tl.float32), [4])])
    for _ in range(2):
        assert [once(t) for t in kinds] == [original(t) for t in kinds]


def test_a_mask_anding_a_scalar_comparison_loads_once_comparisons_are_typed_int1(monkeypatch):
    from tests.toys.interpreted import gather_row
    from triton.runtime import interpreter as triton_interpreter
    from triton.runtime.errors import InterpreterError
    if not hasattr(triton_interpreter, "GridExecutor"):
        pytest.skip("kernels are compiled here: the interpreter is not used")
    interpreter.install()
    builder = triton_interpreter.InterpreterBuilder
    rows = torch.randn(3, 5)
    assert torch.equal(gather_row(rows, 1), rows[1])
    assert torch.equal(gather_row(rows, 3), torch.zeros(5))  # past the last row: masked off
    for name in [n for n in dir(builder) if n.startswith(("create_icmp", "create_fcmp"))]:
        monkeypatch.setattr(builder, name, getattr(builder, name).__wrapped__)
    with pytest.raises(InterpreterError, match="mask has unsupported dtype"):
        gather_row(rows, 1)


def test_install_loads_the_interpreter_when_kernels_will_run_in_it_but_none_is_defined_yet():
    """SGLang defines its kernels when a backend is built, after the runner's install()."""
    check = ("import sys; from kit.harness import interpreter; "
             "assert 'triton.runtime.interpreter' not in sys.modules; assert interpreter.install(); "
             "from triton.runtime.interpreter import InterpreterBuilder; "
             "assert hasattr(InterpreterBuilder.create_icmpSLT, '__wrapped__')")
    env = {"PATH": "", "TRITON_INTERPRET": "1"}
    subprocess.run([sys.executable, "-c", check], env=env, check=True, timeout=SUBPROCESS_TIMEOUT_S)


def test_a_kernel_calling_a_modules_alias_of_a_builtin_runs_once_aliases_are_patched(monkeypatch):
    from tests.toys import interpreted
    import triton.language as tl
    from triton.runtime import interpreter as triton_interpreter
    from triton.runtime.errors import InterpreterError
    if not hasattr(triton_interpreter, "GridExecutor"):
        pytest.skip("kernels are compiled here: the interpreter is not used")
    interpreter.install()
    x = torch.randn(8)
    with monkeypatch.context() as unpatched:
        unpatched.setitem(vars(interpreted), "exp_alias", tl.exp)
        unpatched.setattr(triton_interpreter, "_patch_lang", inspect.unwrap(triton_interpreter._patch_lang))
        with pytest.raises(InterpreterError, match="forget to add @triton.jit"):
            interpreted.exp_of(x)
    torch.testing.assert_close(interpreted.exp_of(x), torch.exp(x))


@pytest.mark.parametrize("planted", [("binary_op", "unary_op"), ("create_fp_trunc",)],
                         ids=["bits-multiplied", "truncated"])
def test_bfloat16_arithmetic_is_the_gpus_once_widened_and_rounded_to_nearest(monkeypatch, planted):
    from tests.toys.interpreted import product
    from triton.runtime import interpreter as triton_interpreter
    if not hasattr(triton_interpreter, "GridExecutor"):
        pytest.skip("kernels are compiled here: the interpreter is not used")
    interpreter.install()
    builder = triton_interpreter.InterpreterBuilder
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, generator=gen).bfloat16(), torch.randn(64, generator=gen).bfloat16()
    assert torch.equal(product(x, w), x * w)  # the exact product rounded once to nearest even, as torch's
    for name in planted:
        monkeypatch.setattr(builder, name, getattr(builder, name).__wrapped__)
    assert not torch.equal(product(x, w), x * w)


@pytest.mark.parametrize("source", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("target", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_a_cast_to_fp8_rounds_to_nearest_even_as_the_gpus(monkeypatch, source, target):
    """Every value of `source` within the target's range (ties, and carries out of the mantissa at an odd
    exponent, among them) cast as torch casts it; beyond the range, the largest finite value (NVIDIA's
    satfinite). The interpreter's own conversion rounds ties up and loses the carry: 1.97 -> 1.0 in e4m3."""
    from tests.toys.interpreted import cast
    from triton.runtime import interpreter as triton_interpreter
    if not hasattr(triton_interpreter, "GridExecutor"):
        pytest.skip("kernels are compiled here: the interpreter is not used")
    interpreter.install()
    largest = torch.finfo(target).max
    if source == torch.float32:  # every float16 value in range, and float32 ties and near-ties between them
        x = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
        x = torch.cat([x, x * (1 + 2 ** -20), x * (1 - 2 ** -20)])
    else:
        x = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(source)
    x = x[x.float().abs() <= largest]
    beyond = torch.tensor([largest * 2, -largest * 2, float("inf")], dtype=source)
    assert torch.equal(cast(x, target).view(torch.uint8), x.to(target).view(torch.uint8))
    assert cast(beyond, target).float().tolist() == [largest, -largest, largest]
    monkeypatch.setattr(triton_interpreter.InterpreterBuilder, "create_fp_to_fp",
                        triton_interpreter.InterpreterBuilder.create_fp_to_fp.__wrapped__)
    assert not torch.equal(cast(x, target).view(torch.uint8), x.to(target).view(torch.uint8))
