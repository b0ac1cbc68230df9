"""Import-time stand-ins for modules SGLang's attention import chain imports but
that cannot be installed here (docs/sglang.md lists each), and the CPU's device
context its kernel wrappers enter (`cpu_device_context`).
Nothing in the installed sglang package is edited.

A finder appended at the END of sys.meta_path serves a shimmed top-level name and
every dotted submodule below it, so a really installed package always wins. It
answers only imports issued from `sglang.*` modules: other libraries probing
`find_spec("torchvision")` still see it absent. A shim module answers any
attribute with a placeholder (attribute chains give more placeholders), so
`from torchvision.transforms import InterpolationMode` and
`InterpolationMode.BICUBIC` in a default argument work at import time; calling,
indexing, iterating or truth-testing a placeholder raises ShimUsedError naming it.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class ShimUsedError(RuntimeError):
    pass


def _is_arch_support_pdl() -> bool:
    """sgl_kernel 0.4.10's sgl_kernel/utils.py:57-66: True on compute capability >= 9,
    so TritonAttnBackend.use_pdl (triton_backend.py:339-340) is what a real install
    gives on the same GPU (PDL changes launch overlap, not numerics)."""
    import torch

    if getattr(torch.version, "hip", None) or getattr(torch.version, "musa", None):
        return False
    try:
        major, _ = torch.cuda.get_device_capability(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - no usable device: no PDL, as sgl_kernel says
        return False
    return major >= 9


# Real values served instead of placeholders: what SGLang calls at construction.
OVERRIDES = {"sgl_kernel.utils": {"is_arch_support_pdl": _is_arch_support_pdl}}


class _Missing:
    __slots__ = ("_name",)

    def __init__(self, name):
        object.__setattr__(self, "_name", name)

    def _fail(self, what=""):
        raise ShimUsedError(f"{self._name}{what} was used, but {self._name.split('.')[0]!r} is only an import "
                            f"shim here (backends/sglang/shims.py): install the real package to use it")

    def __getattr__(self, item):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Missing(f"{self._name}.{item}")

    def __call__(self, *a, **k):
        self._fail("()")

    def __getitem__(self, k):
        self._fail("[...]")

    def __iter__(self):
        self._fail(" (iterated)")

    def __bool__(self):
        self._fail(" (truth-tested)")

    def __mro_entries__(self, bases):
        """A class deriving from a placeholder is defined, and raises when instantiated."""
        name = self._name

        class _ShimBase:
            def __init__(self, *a, **k):
                raise ShimUsedError(f"{name} (shimmed) was instantiated")

        _ShimBase.__name__ = name.rsplit(".", 1)[-1]
        return (_ShimBase,)

    def __repr__(self):
        return f"<shim {self._name}>"


class _ShimModule(types.ModuleType):
    def __getattr__(self, item):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Missing(f"{self.__name__}.{item}")


class _ShimLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _ShimModule(spec.name)
        module.__path__ = []  # a package, so dotted imports below it work
        return module

    def exec_module(self, module):
        for name, value in OVERRIDES.get(module.__name__, {}).items():
            setattr(module, name, value)


def _requested_by_sglang() -> bool:
    """Whether the first frame outside importlib and this module belongs to sglang."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "") or ""
        if frame.f_code.co_filename.startswith("<frozen") or name.startswith("importlib") or name == __name__:
            frame = frame.f_back
            continue
        return name == "sglang" or name.startswith("sglang.")
    return False


class _ShimFinder(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.names or not _requested_by_sglang():
            return None
        return importlib.machinery.ModuleSpec(fullname, _ShimLoader(), is_package=True)


def install(names) -> None:
    """Serve `names` to sglang's imports where no real package is found (idempotent)."""
    if "torchvision" in names:
        # transformers caches "is torchvision installed?" (lru_cache): ask now, before any
        # shim is in sys.modules, or it reads the shim's version later and fails
        # (transformers/utils/import_utils.py:860-864).
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()
    finder = next((f for f in sys.meta_path if isinstance(f, _ShimFinder)), None)
    if finder is None:
        sys.meta_path.append(_ShimFinder(names))
    else:
        finder.names |= set(names)


def cpu_device_context() -> None:
    """torch.cpu.device where torch lacks it: a context that switches nothing. SGLang's kernel wrappers
    enter their tensors' device before a launch (`torch.get_device_module(x.device).device(index)`:
    kernels/ops/mamba/triton_ops/mamba_ssm.py:500, fla/utils.py input_guard); torch gives CUDA's, not
    the CPU's, and a host has one CPU device, so there is nothing to switch."""
    import contextlib

    import torch

    if not hasattr(torch.cpu, "device"):
        torch.cpu.device = lambda index=None: contextlib.nullcontext()
