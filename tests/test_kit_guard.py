"""Guarded allocations catch a write past the end of a tensor the backend allocated."""
import subprocess
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests import SUBPROCESS_TIMEOUT_S
from kit.harness.guard import GUARD_BYTES, Guard
from kit.report.results import REPO


def test_write_inside_is_fine_and_write_past_end_is_caught():
    guard = Guard()
    with guard.watching():
        t = torch.zeros(5, dtype=torch.int32)
        u = torch.empty(3, 2)
    t[:] = 7
    u.fill_(1.0)
    assert guard.check().ok
    t.as_strided((6,), (1,))[5] = 1  # one element past the end, as an index kernel running long would
    check = guard.check()
    assert not check.ok and "(5,) int32" in check.describe()


def test_values_and_shapes_survive_guarding():
    guard = Guard()
    with guard.watching():
        a = torch.arange(2, 9)
        b = torch.full((2, 3), 4.5)
        c = torch.zeros_like(b)
    assert a.tolist() == list(range(2, 9)) and torch.equal(b, torch.full((2, 3), 4.5)) and not c.any()


class _Allocations(TorchDispatchMode):
    """Bytes of every real (not meta) storage the ops under it create (entered before the guard,
    it sees the guard's own allocations)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and not out.is_meta and out.untyped_storage().data_ptr() not in self.seen:
            self.seen.add(out.untyped_storage().data_ptr())
            self.bytes += out.untyped_storage().nbytes()
        return out

    def __enter__(self):
        self.seen = set()
        return super().__enter__()


def test_guarding_does_not_double_memory():
    """A backend's 64 MiB allocation costs 64 MiB plus the canary, not a second copy of it."""
    size = 64 << 20
    guard = Guard()
    with _Allocations() as alloc, guard.watching():
        big = torch.empty(size // 4, dtype=torch.float32)
    assert big.numel() == size // 4
    assert size <= alloc.bytes <= size + 2 * GUARD_BYTES, alloc.bytes
    kept = sum(g.base.untyped_storage().nbytes() for g in guard._mode.guarded)
    assert kept <= size + 2 * GUARD_BYTES and big.untyped_storage().data_ptr() == \
        guard._mode.guarded[0].base.untyped_storage().data_ptr(), "the backend's tensor is the guarded buffer itself"


def test_every_factory_keeps_its_values():
    guard = Guard()
    ref = torch.arange(6, dtype=torch.float64).view(2, 3)
    with guard.watching():
        made = dict(ones=torch.ones(2, 3), full_like=torch.full_like(ref, 2.5), new_full=ref.new_full((4,), 7),
                    new_zeros=ref.new_zeros(3), ones_like=torch.ones_like(ref, dtype=torch.int32),
                    arange3=torch.arange(1, 10, 3), new_ones=ref.new_ones((2,)))
    assert torch.equal(made["ones"], torch.ones(2, 3)) and torch.equal(made["full_like"], torch.full_like(ref, 2.5))
    assert made["new_full"].tolist() == [7.0] * 4 and made["new_full"].dtype == torch.float64
    assert made["new_zeros"].tolist() == [0.0] * 3 and made["ones_like"].dtype == torch.int32
    assert made["arange3"].tolist() == [1, 4, 7] and made["new_ones"].tolist() == [1.0, 1.0]
    assert len(guard._mode.guarded) == len(made) and guard.check().ok


def test_watching_imports_no_compiler():
    """A guarded, NaN-filled step imports neither torch._dynamo nor torch._inductor nor sympy: PyTorch's
    default for a dispatch mode and torch.use_deterministic_algorithms import the first two on first
    use, ~5 s of each worker's start on a GPU machine; arange on the meta device imports sympy, ~4 s."""
    code = ("import sys, torch\n"
            "from kit.harness.guard import Guard\n"
            "from kit.harness.nan_fill import nan_filled_allocations\n"
            "guard = Guard()\n"
            "with guard.watching(), nan_filled_allocations():\n"
            "    x = torch.empty(4)\n"
            "    i = torch.arange(3, 9, 2)\n"
            "assert torch.isnan(x).all() and i.tolist() == [3, 5, 7] and guard.check().ok\n"
            "print(sorted(m for m in ('torch._dynamo', 'torch._inductor', 'sympy') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


class _PinRequests(TorchDispatchMode):
    """Below the guard: records each allocation's pin_memory request and makes a plain tensor (a
    page-locked one needs an accelerator)."""

    def __init__(self):
        super().__init__()
        self.pinned = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        self.pinned.append(bool(kwargs.pop("pin_memory", False)))
        return func(*args, **kwargs)


def test_page_locked_host_buffers_are_allocated_as_asked():
    """A library's page-locked staging buffer (FlashInfer MLA allocates one at its first plan) is
    not replaced by the guard's plain allocation: its plan() refuses an unpinned one."""
    below = _PinRequests()
    with below, Guard().watching():
        torch.empty(8, dtype=torch.uint8, pin_memory=True)
    assert below.pinned == [True]


def test_a_higher_order_operator_runs_beside_the_guard_and_an_overrun_around_it_is_caught():
    """flex attention's eager call is a higher-order operator, which a dispatch mode without a rule
    for it refuses (SGLang's and vLLM's flex backends call it): it runs as unwatched, while the
    backend's own allocations around it keep their canaries."""
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = (torch.randn(1, 2, 8, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    guard = Guard()
    with guard.watching():
        scratch = torch.zeros(5, dtype=torch.int32)
        out = flex_attention(q, k, v)
    assert torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-5)
    assert guard.check().ok
    scratch.as_strided((6,), (1,))[5] = 1  # the backend's own buffer, overrun by one element
    check = guard.check()
    assert not check.ok and "(5,) int32" in check.describe()


def test_compiled_code_compiles_as_unwatched():
    """torch.compile falls back to eager under a dispatch mode unless the mode says it ignores
    compiled code: the guard does, so a backend's compiled kernels run as in production."""
    from torch.utils._python_dispatch import any_torch_dispatch_mode_on_stack

    with Guard().watching():
        assert not any_torch_dispatch_mode_on_stack(), "torch.compile would run the backend's compiled code eagerly"
