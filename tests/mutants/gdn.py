"""Mutants of a GDN backend: each one bug class, made by overriding one method of the in-box
`torch_native_gdn` (its source stays untouched), and the failure class the kit must report for it
(kit.harness.recurrent; tests/test_kit_gdn.py runs each on the smoke cases of its modes)."""
from __future__ import annotations

import dataclasses
from typing import Tuple

import torch

from backends.torch_native_gdn import TorchNativeGDNBackend
from kit.modes import Exec, ForwardMode
from kit.report.record import KERNEL, KV_WRITE

D, E, MX, TV = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY


class DecayAfterUpdate(TorchNativeGDNBackend):
    """The decay applied after the delta write, not before it (the new token's write decays too,
    and its error term reads the undecayed state)."""

    @staticmethod
    def _update(state, k, v, decay, beta):
        err = v - torch.einsum("bhk,bhkv->bhv", k, state)
        state = state + torch.einsum("bhk,bhv->bhkv", k, err * beta[:, :, None])
        return state * decay[:, :, None, None]


class BetaDropped(TorchNativeGDNBackend):
    """beta taken as 1: the full error written, the model's write strength ignored."""

    @staticmethod
    def _update(state, k, v, decay, beta):
        return TorchNativeGDNBackend._update(state, k, v, decay, torch.ones_like(beta))


class StateNotWritten(TorchNativeGDNBackend):
    """The step's final state and window never stored: the next step starts from the old ones."""

    def _write(self, layer_id, seq, states):
        pass


class NewRequestReadsSlot(TorchNativeGDNBackend):
    """has_initial_state ignored: a new request starts from what its slot's last tenant left."""

    def init_forward_metadata(self, batch):
        super().init_forward_metadata(batch)
        self.saved = torch.ones_like(self.saved)


class PaddedRowWrites(TorchNativeGDNBackend):
    """A padded graph row (slot -1) written like a real one: -1 indexes the pool's last slot."""

    def init_forward_metadata(self, batch):
        super().init_forward_metadata(batch)
        self.real = torch.arange(len(self.slots), device=self.slots.device)


class RollbackOffByOne(TorchNativeGDNBackend):
    """A verify stores the state after draft j + 1 where draft j's belongs (the last draft's twice):
    a request that keeps n drafts continues from one more."""

    def _write(self, layer_id, seq, states):
        super()._write(layer_id, seq, states[1:] + states[-1:] if self.verify else states)


class VerifyUpdatesSlot(TorchNativeGDNBackend):
    """A verify also writes the last draft's state into the request's own slot (the rule of a
    backend without per-draft rollback): a request that keeps fewer drafts continues from all."""

    def _write(self, layer_id, seq, states):
        super()._write(layer_id, seq, states)
        if self.verify:
            self.verify = False
            super()._write(layer_id, seq, states)
            self.verify = True


class LayerIgnored(TorchNativeGDNBackend):
    """Every layer's state read and written in layer 0's pools."""

    def forward(self, mixed_qkv, a, b, layer, batch):
        return super().forward(mixed_qkv, a, b, dataclasses.replace(layer, layer_id=0), batch)


class KeyNotNormalized(TorchNativeGDNBackend):
    """q's L2 norm applied, k's forgotten (use_qk_l2norm_in_kernel half done)."""

    @staticmethod
    def _qk(q, k, group):
        q = torch.nn.functional.normalize(q, dim=-1) * q.shape[-1] ** -0.5
        return q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)


@dataclasses.dataclass(frozen=True)
class GdnMutant:
    name: str
    backend: type
    expect: Tuple[str, ...]  # the failure classes the kit may report
    modes: Tuple[ForwardMode, ...]  # the modes the bug shows in
    execs: Tuple[Exec, ...] = (Exec.EAGER,)


MUTANTS = [
    GdnMutant("decay_after_update", DecayAfterUpdate, (KV_WRITE, KERNEL), (D, E, MX, TV)),
    GdnMutant("beta_dropped", BetaDropped, (KV_WRITE, KERNEL), (D, E, MX, TV)),
    GdnMutant("state_not_written", StateNotWritten, (KV_WRITE,), (D, E, MX, TV)),
    GdnMutant("new_request_reads_slot", NewRequestReadsSlot, (KERNEL, KV_WRITE), (D, E, MX, TV)),
    GdnMutant("padded_row_writes_slot", PaddedRowWrites, (KV_WRITE,), (D, TV), (Exec.GRAPH,)),
    GdnMutant("rollback_off_by_one", RollbackOffByOne, (KV_WRITE,), (TV,)),
    GdnMutant("verify_updates_slot", VerifyUpdatesSlot, (KV_WRITE,), (TV,)),
    GdnMutant("layer_ignored", LayerIgnored, (KV_WRITE, KERNEL), (D, E, MX, TV)),
    GdnMutant("key_not_normalized", KeyNotNormalized, (KV_WRITE, KERNEL), (D, E, MX, TV)),
]
