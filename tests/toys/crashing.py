"""Backends that take their process down (as a device fault would), exit, raise past `except
Exception`, or hang, on batches of 3 requests of an MQA model (of the smoke decode cases, only
mqa_p1_shuf, bs 3, ever hands them one: eager, its 2nd and 3rd batches; or in graph replays);
and a class that is no backend."""
import os
import sys
import time

from backends.torch_native import TorchNativeBackend
from kit.engine.case import MQA, Case
from kit.engine.catalog import Catalog
from kit.modes import Exec, ForwardMode
from kit.mutation import Mutant
from kit.report.record import CRASH


class _MisbehavesOnThree(TorchNativeBackend):
    """torch_native, except on batches of exactly 3 requests of an MQA model; dense only (an MLA
    layer has one KV head too)."""

    attention_kinds = ("dense",)

    def misbehave(self, layer, batch) -> None:
        raise NotImplementedError

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if batch.batch_size == 3 and layer.tp_k_head_num == 1:
            self.misbehave(layer, batch)
        return super().forward(q, k, v, layer, batch, save_kv_cache)


class HardCrashBackend(_MisbehavesOnThree):
    name = "toy_hard_crash"

    def misbehave(self, layer, batch):
        os._exit(3)


class HangBackend(_MisbehavesOnThree):
    """Stands for a hung kernel."""

    name = "toy_hang"

    def misbehave(self, layer, batch):
        time.sleep(600)


class NativeHangBackend(_MisbehavesOnThree):
    """Stands for a wait that never ends in native code (a kernel that never finishes, seen from
    the device's synchronize): a C call that releases the GIL and never returns to Python, even
    for the time limit's signal."""

    name = "toy_native_hang"

    def misbehave(self, layer, batch):
        import ctypes
        import signal

        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        ctypes.CDLL(None).sleep(600)


class TorchErrorBackend(_MisbehavesOnThree):
    """Hands torch shapes that do not fit: the traceback ends inside torch's own Python code."""

    name = "toy_torch_error"

    def misbehave(self, layer, batch):
        import torch

        torch.einsum("ij,jk->ik", torch.ones(2, 3), torch.ones(2, 3))


class DeviceFaultBackend(_MisbehavesOnThree):
    """Reads far out of bounds. On CUDA that is a real device-side assert (the context is lost);
    on CPU the IndexError is re-raised as the CUDA error would read."""

    name = "toy_device_fault"

    def misbehave(self, layer, batch):
        k_cache = batch.token_to_kv_pool.get_key_buffer(layer.layer_id)
        bad = batch.out_cache_loc + k_cache.shape[0] * 1000
        try:
            k_cache[bad].sum().item()
        except IndexError as exc:
            raise RuntimeError(f"CUDA error: device-side assert triggered (simulated on CPU: {exc})") from exc


class ExitZeroBackend(_MisbehavesOnThree):
    """Ends its process with exit code 0, as a backend calling os._exit(0) would: no exception,
    no report, and a plain pytest run that exits 'successfully'."""

    name = "toy_exit_zero"

    def misbehave(self, layer, batch):
        os._exit(0)


class SysExitBackend(_MisbehavesOnThree):
    name = "toy_sys_exit"

    def misbehave(self, layer, batch):
        sys.exit(3)


class Abort(BaseException):
    """Not an Exception: escapes `except Exception`."""


class BaseExceptionBackend(_MisbehavesOnThree):
    name = "toy_base_exception"

    def misbehave(self, layer, batch):
        raise Abort("raised past except Exception")


class InterruptBackend(_MisbehavesOnThree):
    """Stands for the user pressing Ctrl-C during a run."""

    name = "toy_interrupt"

    def misbehave(self, layer, batch):
        raise KeyboardInterrupt


class NoSupports:
    """A class that forgot `supports` (and the rest of the protocol)."""

    name = "toy_no_supports"

    def __init__(self, ctx):
        self.ctx = ctx


class OutOfMemoryBackend(_MisbehavesOnThree):
    """Runs out of device memory in its own forward (as an oversized workspace would)."""

    name = "toy_out_of_memory"

    def misbehave(self, layer, batch):
        import torch
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB (planted in forward)")


class TritonOutOfMemoryBackend(_MisbehavesOnThree):
    """Runs out of device memory at a Triton kernel's launch, which Triton's driver reports as a
    RuntimeError (its launcher's cuLaunchKernel / module load)."""

    name = "toy_triton_out_of_memory"

    def misbehave(self, layer, batch):
        raise RuntimeError("Triton Error [CUDA]: out of memory")


class AbortsInForwardBackend(TorchNativeBackend):
    """Takes its process down (abort) in its first forward, whatever the case: a fuzz of it ends
    at its first example."""

    name = "toy_aborts_in_forward"
    attention_kinds = ("dense",)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        os.abort()


class GuardedOpErrorBackend(_MisbehavesOnThree):
    """An op that fails inside torch's dispatch, which the kit's guard (kit.harness.guard) sits in
    while forward runs: the traceback passes through the kit's frame between the backend's and
    torch's, as a shape error in SGLang's EXTEND metadata does."""

    name = "toy_guarded_op_error"

    def misbehave(self, layer, batch):
        import torch

        torch.zeros(2).copy_(torch.ones(16))


class MetaOutputBackend(TorchNativeBackend):
    """Returns its output on the meta device: a tensor of the right shape and dtype with no values."""

    name = "toy_meta_output"
    attention_kinds = ("dense",)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        import torch

        _, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        return torch.empty(q.shape[0], layer.tp_q_head_num, layer.v_head_dim, dtype=q.dtype, device="meta"), lse


class InterruptsLaterBackend(TorchNativeBackend):
    """Stands for the user pressing Ctrl-C once a few batches have run (a search under way)."""

    name = "toy_interrupts_later"
    attention_kinds = ("dense",)
    batches = 0

    def init_forward_metadata(self, batch) -> None:
        InterruptsLaterBackend.batches += 1
        if InterruptsLaterBackend.batches > 4:
            raise KeyboardInterrupt
        super().init_forward_metadata(batch)


class InterpreterError(Exception):
    """Stands for Triton's: its interpreter raises every error of a kernel as one, caused by it."""


def _interpreter_timeout():
    from kit.harness.timeout import RunTimeout

    limit = RunTimeout(2)
    raise InterpreterError(repr(limit)) from limit


class InterpretedTimeoutBackend(TorchNativeBackend):
    """Its kernels run in Triton's interpreter when the run's time limit arrives."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        _interpreter_timeout()


class WrongThenTimesOutBackend(TorchNativeBackend):
    """Wrong on its first instance; the time limit arrives, in Triton's interpreter, while a fresh
    instance runs the batch again to tell which host mirror is to blame."""

    instances = 0

    def init_forward_metadata(self, batch) -> None:
        if not hasattr(self, "number"):
            WrongThenTimesOutBackend.instances += 1
            self.number = WrongThenTimesOutBackend.instances
        super().init_forward_metadata(batch)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if self.number > 1:
            _interpreter_timeout()
        out, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        return out + 1, lse


# One MQA decode case of three requests: a catalog (`--cases tests.toys.crashing:CATALOG`) whose every run
# hands these backends their batch of 3.
_THREE = Case("mqa_three", ForwardMode.DECODE, prefix=(4, 9, 6), heads=MQA, head_dim=16, dtype="fp32")
CATALOG = Catalog({ForwardMode.DECODE: {"smoke": [_THREE], "full": [_THREE]}})
# A mutant catalog (`--catalog tests.toys.crashing:MUTANTS`) whose mutant leaves its process stuck.
MUTANTS = (Mutant(98, "stuck_in_native_code", "tests.toys.crashing:NativeHangBackend", (CRASH,), (ForwardMode.DECODE,),
                  (Exec.EAGER,), cpu=True),)
