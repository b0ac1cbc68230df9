"""Out-of-memory errors planted as torch's allocator raises them, and a pytest plugin
(`-p tests.toys.kit_out_of_memory`) with which installing a batch in the kit's pool always runs out."""
import torch


def raising_in_torch(original, times):
    """`original`, except that its first `times` calls raise torch's out-of-memory error from a
    frame of torch's own (as its allocator raises it): the caller is whoever asked. (the wrapper,
    the list of its calls)"""
    code = ("def allocation(*args, **kwargs):\n"
            "    if calls.append(1) or len(calls) <= times:\n"
            "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB (planted)')\n"
            "    return original(*args, **kwargs)\n")
    scope = {"torch": torch, "original": original, "times": times, "calls": []}
    exec(compile(code, torch.__file__, "exec"), scope)
    return scope["allocation"], scope["calls"]


def pytest_configure(config):
    from kit.engine.fixture import Fixture
    Fixture.install = raising_in_torch(Fixture.install, times=10 ** 9)[0]
