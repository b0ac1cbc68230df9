"""A PyTorch gated delta net (GDN) backend: float32 arithmetic over the batch, one token column at a
time for every request at once (requests padded to the longest; a request past its length keeps its
state). It reads and writes the state pools by the batch's state slots: a request without a saved
state starts from zeros, a padded row (slot -1) writes nothing, and a verify writes each draft's
state and window to the intermediate pools (SGLang's rule) and leaves the slot's own as it was."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kit.engine.kinds.gdn import MODES
from kit.modes import ForwardMode


class TorchNativeGDNBackend:
    name = "torch_native_gdn"
    modes = MODES
    attention_kinds = ("gdn",)

    def __init__(self, ctx):
        self.pool = ctx.state_pool

    def init_forward_metadata(self, batch) -> None:
        self.lens = list(batch.extend_seq_lens_cpu)
        self.starts = batch.query_start_loc.tolist()
        self.slots = batch.state_indices.to(torch.int64)
        self.real = (self.slots >= 0).nonzero().squeeze(1)  # rows that own a slot
        self.saved = batch.has_initial_state
        self.verify = batch.forward_mode == ForwardMode.TARGET_VERIFY

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        """[bs, longest, ...] of a [T, ...] token tensor, float32 (zeros past a request's length)."""
        out = x.new_zeros((len(self.lens), max(self.lens)) + x.shape[1:], dtype=torch.float32)
        for i, (s, n) in enumerate(zip(self.starts, self.lens)):
            out[i, :n] = x[s:s + n].float()
        return out

    def _start(self, pool: torch.Tensor) -> torch.Tensor:
        """Each row's saved entry of `pool` (float32), zeros where it has none."""
        held = pool[self.slots.clamp_min(0)].float()
        return torch.where(self.saved.view(-1, *[1] * (held.dim() - 1)), held, torch.zeros_like(held))

    def forward(self, mixed_qkv, a, b, layer, batch):
        hk, hv, dk, dv = layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
        conv_pool, state_pool = self.pool.conv(layer.layer_id), self.pool.temporal(layer.layer_id)
        width = layer.conv_weights.shape[1]
        rows, gate_a, gate_b = self._padded(mixed_qkv), self._padded(a), self._padded(b)  # [bs, L, ...]
        longest = rows.shape[1]
        seq = torch.cat([self._start(conv_pool), rows.transpose(1, 2)], dim=2)  # [bs, conv_dim, w - 1 + L]
        taps = seq.unfold(2, width, 1)  # [bs, conv_dim, L, w]
        mixed = F.silu(torch.einsum("bclw,cw->blc", taps, layer.conv_weights.float()))
        q, k, v = mixed.split([layer.q_dim, layer.k_dim, layer.v_dim], dim=-1)
        q, k = self._qk(q.unflatten(-1, (hk, dk)), k.unflatten(-1, (hk, dk)), hv // hk)
        v = v.unflatten(-1, (hv, dv))
        decay = torch.exp(-layer.A_log.float().exp() * F.softplus(gate_a + layer.dt_bias.float()))  # [bs, L, Hv]
        beta = torch.sigmoid(gate_b)
        state = self._start(state_pool)  # [bs, Hv, K, V]
        lens = torch.tensor(self.lens, device=rows.device)
        outs, states = [], []
        for t in range(longest):
            live = (t < lens).view(-1, 1, 1, 1)
            state = torch.where(live, self._update(state, k[:, t], v[:, t], decay[:, t], beta[:, t]), state)
            states.append(state)
            outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
        out = torch.stack(outs, dim=1)  # [bs, L, Hv, V]
        self._write(layer.layer_id, seq, states)
        return torch.cat([out[i, :n] for i, n in enumerate(self.lens)]).to(mixed_qkv.dtype)

    @staticmethod
    def _qk(q, k, group):
        """q and k [bs, L, Hk, K] L2-normalized per head (q scaled by K^-0.5), one per value head."""
        q = F.normalize(q, dim=-1) * q.shape[-1] ** -0.5
        return q.repeat_interleave(group, dim=2), F.normalize(k, dim=-1).repeat_interleave(group, dim=2)

    @staticmethod
    def _update(state, k, v, decay, beta):
        """One token's delta rule on [bs, Hv, K, V] states: decay, then write beta (v - k^T S) along k."""
        state = state * decay[:, :, None, None]
        err = v - torch.einsum("bhk,bhkv->bhv", k, state)
        return state + torch.einsum("bhk,bhv->bhkv", k, err * beta[:, :, None])

    def _write(self, layer_id: int, seq: torch.Tensor, states) -> None:
        width = seq.shape[2] - max(self.lens) + 1
        real, slots = self.real, self.slots[self.real]
        if self.verify:
            for j in range(max(self.lens)):
                self.pool.intermediate_ssm(layer_id)[slots, j] = states[j][real]
                window = seq[real, :, j + 1:j + width]
                self.pool.intermediate_conv(layer_id)[slots, j] = window.to(self.pool.conv(layer_id).dtype)
            return
        last = torch.tensor(self.lens, device=seq.device)[real]
        final = torch.stack([states[n - 1][i] for i, n in zip(real.tolist(), last.tolist())]) if len(real) else None
        windows = torch.stack([seq[i, :, n:n + width - 1] for i, n in zip(real.tolist(), last.tolist())]) if len(real) else None
        if final is not None:
            self.pool.temporal(layer_id)[slots] = final
            self.pool.conv(layer_id)[slots] = windows.to(self.pool.conv(layer_id).dtype)
