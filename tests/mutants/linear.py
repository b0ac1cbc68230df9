"""Mutants of a backend of the recurrent kinds (GDN, Mamba2, KDA): each one bug class, made by overriding
one method of the in-box `torch_native_linear` (its source stays untouched), and the failure class
the kit must report for it (kit.harness.recurrent): rows of the mutant catalog, scored by `python -m kit
mutate` on the recurrent cases of their modes."""
from __future__ import annotations

import dataclasses
import torch

from backends.torch_native_linear import TorchNativeLinearBackend
from kit.modes import Exec, ForwardMode
from kit.mutation import Mutant
from kit.report.record import KERNEL, KV_WRITE


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


class Mamba2OneGroup(TorchNativeLinearBackend):
    """Mamba2's n_groups taken as 1: every head reads group 0's B and C."""

    def _mamba2(self, layer, c, b, x, gates, state):
        return super()._mamba2(layer, c[:, :, :1].expand_as(c), b[:, :, :1].expand_as(b), x, gates, state)


class Mamba2DtBiasDropped(TorchNativeLinearBackend):
    """Mamba2's dt taken as softplus(dt), its dt_bias left out (the decay and the input term both read it)."""

    def _mamba2(self, layer, c, b, x, gates, state):
        return super()._mamba2(dataclasses.replace(layer, dt_bias=torch.zeros_like(layer.dt_bias)), c, b, x, gates,
                               state)


class KdaGateChannelsMisread(TorchNativeLinearBackend):
    """KDA's gate input [T, Hv K] read channel-major ([K, Hv]): each head's decay takes other heads' channels."""

    def _kda(self, layer, q, k, v, gates, state):
        g, b = gates
        g = g.unflatten(-1, (layer.head_k_dim, layer.num_v_heads)).transpose(-1, -2).flatten(-2)
        return super()._kda(layer, q, k, v, (g, b), state)


class KdaBiasPerHead(TorchNativeLinearBackend):
    """KDA's dt_bias [Hv K] taken as one per head (each head's first channel's): GDN's bias on KDA's layer."""

    def _kda(self, layer, q, k, v, gates, state):
        bias = layer.dt_bias.unflatten(0, (layer.num_v_heads, layer.head_k_dim))[:, :1].expand(-1, layer.head_k_dim)
        return super()._kda(dataclasses.replace(layer, dt_bias=bias.flatten()), q, k, v, gates, state)


L = "tests.mutants.linear:"
D, E, MX, TV = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY
STEPS = (D, E, MX, TV)
STATE = (KV_WRITE, KERNEL)
EAGER, GRAPH = (Exec.EAGER,), (Exec.GRAPH,)


def _of(*kinds):
    """The cases of `kinds` (Mutant.reaches): the kinds the bug shows in."""
    return lambda case: case.kind in kinds


DELTA, ALL = _of("gdn", "kda"), _of("gdn", "mamba2", "kda")  # the delta-rule kinds; every kind
# Rows of the mutant catalog (tests/mutants/__init__.py), numbered from 100: each scored on the recurrent
# cases of its modes, those of the kinds it shows in first.
MUTANTS = [
    Mutant(100, "decay_after_update", L + "DecayAfterUpdate", STATE, STEPS, EAGER, cpu=True, reaches=DELTA),
    Mutant(101, "beta_dropped", L + "BetaDropped", STATE, STEPS, EAGER, cpu=True, reaches=DELTA),
    Mutant(102, "key_not_normalized", L + "KeyNotNormalized", STATE, STEPS, EAGER, cpu=True, reaches=DELTA),
    Mutant(103, "kda_gate_per_head", L + "KdaGatePerHead", STATE, STEPS, EAGER, cpu=True, reaches=_of("kda")),
    Mutant(104, "state_not_written", L + "StateNotWritten", (KV_WRITE,), STEPS, EAGER, cpu=True, reaches=ALL),
    Mutant(105, "new_request_reads_slot", L + "NewRequestReadsSlot", (KERNEL, KV_WRITE), STEPS, EAGER, cpu=True,
           reaches=ALL),
    Mutant(106, "padded_row_writes_slot", L + "PaddedRowWrites", (KV_WRITE,), (D, TV), GRAPH, cpu=True, reaches=ALL),
    Mutant(107, "rollback_off_by_one", L + "RollbackOffByOne", (KV_WRITE,), (TV,), EAGER, cpu=True, reaches=ALL),
    Mutant(108, "verify_updates_slot", L + "VerifyUpdatesSlot", (KV_WRITE,), (TV,), EAGER, cpu=True, reaches=ALL),
    Mutant(109, "layer_ignored", L + "LayerIgnored", STATE, STEPS, EAGER, cpu=True, reaches=ALL),
    Mutant(110, "state_not_transposed", L + "StateNotTransposed", STATE, STEPS, EAGER, cpu=True, reaches=ALL),
    Mutant(111, "skip_dropped", L + "SkipDropped", (KERNEL,), STEPS, EAGER, cpu=True, reaches=_of("mamba2")),
    Mutant(112, "input_not_scaled_by_dt", L + "InputNotScaledByDt", STATE, STEPS, EAGER, cpu=True,
           reaches=_of("mamba2")),
    Mutant(113, "mamba2_one_group", L + "Mamba2OneGroup", STATE, STEPS, EAGER, cpu=True, reaches=_of("mamba2")),
    Mutant(114, "mamba2_dt_bias_dropped", L + "Mamba2DtBiasDropped", STATE, STEPS, EAGER, cpu=True,
           reaches=_of("mamba2")),
    Mutant(115, "kda_gate_channels_misread", L + "KdaGateChannelsMisread", STATE, STEPS, EAGER, cpu=True,
           reaches=_of("kda")),
    Mutant(116, "kda_bias_per_head", L + "KdaBiasPerHead", STATE, STEPS, EAGER, cpu=True, reaches=_of("kda")),
]
