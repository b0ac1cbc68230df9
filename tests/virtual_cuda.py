"""A CUDA device for host-side code on a machine without one: inside `VirtualCuda()`, a tensor made
for "cuda" (a factory's device=, .to("cuda"), .cuda()) is a CPU tensor of type OnCuda that reports
device cuda:0, and an op mixing one with a host tensor of one or more dimensions raises torch's own
"Expected all tensors to be on the same device" error, as on a GPU. Values stay real, so code that
reads them on the host (.item(), .tolist(), an engine's metadata builder) runs as on a GPU; kernels
do not (use it for metadata, stop before a launch).

Torch's rules kept, where an engine's host code relies on them: host scalars (0-dim) mix freely;
copy_ crosses devices; a device tensor is indexed by host indices; .cpu() and .to("cpu") copy back
to a plain host tensor."""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

CUDA = torch.device("cuda", 0)
_DEVICE = torch.Tensor.device.__get__
_IS_CUDA = torch.Tensor.is_cuda.__get__
_IS_CPU = torch.Tensor.is_cpu.__get__
# What torch lets cross devices (the index read: a device tensor by host indices).
_CROSSES = {torch.Tensor.copy_, torch.Tensor.__getitem__}


class OnCuda(torch.Tensor):
    """A host tensor standing for one on the CUDA device (ops on it keep the type)."""


def _is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _target(func, args, kwargs):
    """The device a move or a factory asks for, or None."""
    if func is torch.Tensor.cuda:
        return CUDA
    if func is torch.Tensor.cpu:
        return torch.device("cpu")
    if "device" in kwargs:
        return kwargs["device"]
    if func is torch.Tensor.to:
        for arg in args[1:]:
            if isinstance(arg, (str, torch.device)):
                return arg
            if isinstance(arg, torch.Tensor):
                return _DEVICE(arg) if not isinstance(arg, OnCuda) else CUDA
    return None


def _host(t):
    return t.as_subclass(torch.Tensor) if isinstance(t, OnCuda) else t


class VirtualCuda(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (_DEVICE, _IS_CUDA, _IS_CPU) and isinstance(args[0], OnCuda):
            return {_DEVICE: CUDA, _IS_CUDA: True, _IS_CPU: False}[func]
        target = _target(func, args, kwargs)
        if target is not None:
            if func is torch.Tensor.cuda:
                func = torch.Tensor.clone
            elif func is torch.Tensor.cpu:
                return _host(args[0]).clone()
            elif func is torch.Tensor.to:
                args = (args[0],) + tuple(a for a in args[1:] if not isinstance(a, (str, torch.device, torch.Tensor)))
                kwargs.pop("device", None)
                kwargs.pop("non_blocking", None)
                if not _is_cuda(target):
                    return _host(func(*args, **kwargs)).clone()
                out = func(*args, **kwargs)
                return (out if out is not args[0] else out.clone()).as_subclass(OnCuda)
            else:
                kwargs["device"] = "cpu"
                kwargs.pop("pin_memory", None)
            if _is_cuda(target):
                return tree_map(lambda t: _host(t).as_subclass(OnCuda) if isinstance(t, torch.Tensor) else t,
                                func(*args, **kwargs))
            return func(*args, **kwargs)
        if func not in _CROSSES:
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            on_cuda = any(isinstance(t, OnCuda) for t in tensors)
            if on_cuda and any(not isinstance(t, OnCuda) and t.dim() > 0 for t in tensors):
                raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                                   "devices, cuda:0 and cpu!")
        return func(*args, **kwargs)
