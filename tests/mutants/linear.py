"""Mutants of a backend of the recurrent kinds (GDN, Mamba2, KDA): each one bug class, made by overriding
one method of the in-box `torch_native_linear` (its source stays untouched), and the failure class
the kit must report for it (kit.harness.recurrent; tests/test_kit_linear.py runs each on the smoke
cases of its kinds and modes)."""
from __future__ import annotations

import dataclasses
from typing import Tuple

import torch

from backends.torch_native_linear import TorchNativeLinearBackend
from kit.modes import Exec, ForwardMode
from kit.report.record import KERNEL, KV_WRITE

D, E, MX, TV = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY


class DecayAfterUpdate(TorchNativeLinearBackend):
    """The decay applied after the delta write, not before it (the new token's write decays too,
    and its error term reads the undecayed state)."""

    @staticmethod
    def _update(state, k, v, decay, beta):
        err = v - torch.einsum("bhk,bhkv->bhv", k, state)
        state = state + torch.einsum("bhk,bhv->bhkv", k, err * beta[:, :, None])
        return state * decay[..., None]


class BetaDropped(TorchNativeLinearBackend):
    """beta taken as 1: the full error written, the model's write strength ignored."""

    @staticmethod
    def _update(state, k, v, decay, beta):
        return TorchNativeLinearBackend._update(state, k, v, decay, torch.ones_like(beta))


class StateNotWritten(TorchNativeLinearBackend):
    """The step's final state and window never stored: the next step starts from the old ones."""

    def _write(self, layer_id, seq, states):
        pass


class NewRequestReadsSlot(TorchNativeLinearBackend):
    """has_initial_state ignored: a new request starts from what its slot's last tenant left."""

    def init_forward_metadata(self, batch):
        super().init_forward_metadata(batch)
        self.saved = torch.ones_like(self.saved)


class PaddedRowWrites(TorchNativeLinearBackend):
    """A padded graph row (slot -1) written like a real one: -1 indexes the pool's last slot."""

    def init_forward_metadata(self, batch):
        super().init_forward_metadata(batch)
        self._own(list(range(len(self.lens))))


class RollbackOffByOne(TorchNativeLinearBackend):
    """A verify stores the state after draft j + 1 where draft j's belongs (the last draft's twice):
    a request that keeps n drafts continues from one more."""

    def _write(self, layer_id, seq, states):
        super()._write(layer_id, seq, states[1:] + states[-1:] if self.verify else states)


class VerifyUpdatesSlot(TorchNativeLinearBackend):
    """A verify also writes the last draft's state into the request's own slot (the rule of a
    backend without per-draft rollback): a request that keeps fewer drafts continues from all."""

    def _write(self, layer_id, seq, states):
        super()._write(layer_id, seq, states)
        if self.verify:
            self.verify = False
            super()._write(layer_id, seq, states)
            self.verify = True


class LayerIgnored(TorchNativeLinearBackend):
    """Every layer's state read and written in layer 0's pools."""

    def forward(self, projected, *gates_and_layer):
        *gates, layer, batch = gates_and_layer
        return super().forward(projected, *gates, dataclasses.replace(layer, layer_id=0), batch)


class KeyNotNormalized(TorchNativeLinearBackend):
    """q's L2 norm applied, k's forgotten (use_qk_l2norm_in_kernel half done)."""

    @staticmethod
    def _qk(q, k, group):
        q = torch.nn.functional.normalize(q, dim=-1) * q.shape[-1] ** -0.5
        return q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)


class KdaGatePerHead(TorchNativeLinearBackend):
    """KDA's per-channel decay taken as one per head (its first key channel's): GDN's gate on KDA's layer."""

    def _delta(self, layer, q, k, v, decay, b, state):
        if layer.kind == "kda":
            decay = decay[..., :1].expand_as(decay)
        return super()._delta(layer, q, k, v, decay, b, state)


class SkipDropped(TorchNativeLinearBackend):
    """Mamba2's D x skip left out of the output (the state is right)."""

    def forward(self, projected, *gates_and_layer):
        *gates, layer, batch = gates_and_layer
        if layer.D is not None:
            layer = dataclasses.replace(layer, D=torch.zeros_like(layer.D))
        return super().forward(projected, *gates, layer, batch)


class InputNotScaledByDt(TorchNativeLinearBackend):
    """Mamba2's input term written as B x^T, not dt B x^T (the decay still uses dt)."""

    @staticmethod
    def _ssm_update(state, b, x, decay, dt):
        return TorchNativeLinearBackend._ssm_update(state, b, x, decay, torch.ones_like(dt))


class StateNotTransposed(TorchNativeLinearBackend):
    """The pool, laid out [Hv, V, K], read and written as if it were [Hv, K, V] (the same memory
    reinterpreted; a square state would hide it, the smoke cases' are not)."""

    @staticmethod
    def _from_pool(layer, state):
        return state.reshape(state.shape[:2] + (layer.head_k_dim, layer.head_v_dim))

    @staticmethod
    def _to_pool(layer, state):
        return state.reshape(state.shape[:2] + (layer.head_v_dim, layer.head_k_dim))


@dataclasses.dataclass(frozen=True)
class LinearMutant:
    name: str
    backend: type
    expect: Tuple[str, ...]  # the failure classes the kit may report
    modes: Tuple[ForwardMode, ...]  # the modes the bug shows in
    kinds: Tuple[str, ...]  # the kinds it shows in
    execs: Tuple[Exec, ...] = (Exec.EAGER,)


DELTA, ALL = ("gdn", "kda"), ("gdn", "mamba2", "kda")  # the delta-rule kinds; every kind
MUTANTS = [
    LinearMutant("decay_after_update", DecayAfterUpdate, (KV_WRITE, KERNEL), (D, E, MX, TV), kinds=DELTA),
    LinearMutant("beta_dropped", BetaDropped, (KV_WRITE, KERNEL), (D, E, MX, TV), kinds=DELTA),
    LinearMutant("key_not_normalized", KeyNotNormalized, (KV_WRITE, KERNEL), (D, E, MX, TV), kinds=DELTA),
    LinearMutant("kda_gate_per_head", KdaGatePerHead, (KV_WRITE, KERNEL), (D, E, MX, TV), kinds=("kda",)),
    LinearMutant("state_not_written", StateNotWritten, (KV_WRITE,), (D, E, MX, TV), kinds=ALL),
    LinearMutant("new_request_reads_slot", NewRequestReadsSlot, (KERNEL, KV_WRITE), (D, E, MX, TV), kinds=ALL),
    LinearMutant("padded_row_writes_slot", PaddedRowWrites, (KV_WRITE,), (D, TV), ALL, (Exec.GRAPH,)),
    LinearMutant("rollback_off_by_one", RollbackOffByOne, (KV_WRITE,), (TV,), kinds=ALL),
    LinearMutant("verify_updates_slot", VerifyUpdatesSlot, (KV_WRITE,), (TV,), kinds=ALL),
    LinearMutant("layer_ignored", LayerIgnored, (KV_WRITE, KERNEL), (D, E, MX, TV), kinds=ALL),
    LinearMutant("state_not_transposed", StateNotTransposed, (KV_WRITE, KERNEL), (D, E, MX, TV), kinds=ALL),
    LinearMutant("skip_dropped", SkipDropped, (KERNEL,), (D, E, MX, TV), kinds=("mamba2",)),
    LinearMutant("input_not_scaled_by_dt", InputNotScaledByDt, (KV_WRITE, KERNEL), (D, E, MX, TV), kinds=("mamba2",)),
]
