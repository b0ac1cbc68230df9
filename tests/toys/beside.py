"""Backends whose output for a request depends on whether another request is beside it, by a share of
the output tolerance (tests/test_kit_invariance.py)."""
from __future__ import annotations

from backends.torch_native import TorchNativeBackend
from kit.harness.checks import ABS_FLOOR


class NudgedBesideOthers(TorchNativeBackend):
    """The first value of every output row nudged up in a batch of several requests and down in a batch
    of one, by 0.9 of the dtype's absolute floor: each batch passes its golden check, but a request's
    rows alone and beside others differ by more than the tolerance. It declares no batch invariance."""

    batch_invariant = False
    share = 0.9

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        out[:, 0, 0] += self.share * ABS_FLOOR[out.dtype] * (1 if batch.batch_size > 1 else -1)
        return out, lse


class SlightlyNudged(NudgedBesideOthers):
    """Nudged by a tenth of the floor: within the tolerance, alone and beside others."""

    share = 0.1


class SlightlyNudgedDeclared(SlightlyNudged):
    """As SlightlyNudged, but declaring itself batch invariant: the last bits must not move."""

    batch_invariant = True
