"""A PyTorch backend of the recurrent kinds, gated delta net (GDN), Mamba2 and KDA: float32 arithmetic
over the batch, one token column at a time for every request at once (requests padded to the longest; a request past its length keeps its
state). It reads and writes the state pools by the batch's state slots: a request without a saved
state starts from zeros, a padded row (slot -1) writes nothing, and a verify writes each draft's
state and window to the intermediate pools at the request's batch position (SGLang's rule), leaves
the slot's state as it was and slides its window over the drafts."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kit.engine.kinds.recurrent import KINDS, MODES
from kit.engine.profile import SGLANG
from kit.modes import ForwardMode


class TorchNativeLinearBackend:
    name = "torch_native_linear"
    profile = SGLANG  # its pad slot (-1) and verify rule (drafts to the intermediate pools) are SGLang's
    modes = MODES
    attention_kinds = tuple(KINDS)

    @classmethod
    def supports(cls, case):
        return None

    def __init__(self, ctx):
        self.pool = ctx.state_pool

    def init_forward_metadata(self, batch) -> None:
        # Everything forward() indexes by is made here, on the host and as device tensors, so that
        # forward() waits for nothing and copies nothing from the host (it may be captured in a graph).
        self.lens = list(batch.extend_seq_lens_cpu)
        self.lens_tensor = torch.tensor(self.lens, device=batch.state_indices.device)
        self.starts = batch.query_start_loc.tolist()
        self.slots = batch.state_indices.to(torch.int64)
        self._own([i for i, slot in enumerate(batch.state_indices.tolist()) if slot >= 0])
        self.saved = batch.has_initial_state
        self.verify = batch.forward_mode == ForwardMode.TARGET_VERIFY

    def _own(self, rows) -> None:
        """The rows that own a slot (a padded row owns none): they alone are written back."""
        self.rows = rows
        self.real = torch.tensor(rows, dtype=torch.int64, device=self.slots.device)

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

    def forward(self, projected, *gates_and_layer):
        """GDN: forward(mixed_qkv, a, b, layer, batch); Mamba2: forward(xBC, dt, layer, batch). Out [T, Hv, V]."""
        *gates, layer, batch = gates_and_layer
        hk, hv, dk, dv = layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
        conv_pool, state_pool = self.pool.conv(layer.layer_id), self.pool.temporal(layer.layer_id)
        width = layer.conv_weights.shape[1]
        rows, gates = self._padded(projected), [self._padded(g) for g in gates]  # [bs, L, ...]
        seq = torch.cat([self._start(conv_pool), rows.transpose(1, 2)], dim=2)  # [bs, conv_dim, w - 1 + L]
        taps = seq.unfold(2, width, 1)  # [bs, conv_dim, L, w]
        mixed = F.silu(torch.einsum("bclw,cw->blc", taps, layer.conv_weights.float()))
        q, k, v = layer.spec.split(mixed, layer)
        q, k = q.unflatten(-1, (hk, dk)), k.unflatten(-1, (hk, dk))
        v = v.unflatten(-1, (hv, dv))
        state = self._from_pool(layer, self._start(state_pool))  # [bs, Hv, K, V]
        step = {"gdn": self._gdn, "kda": self._kda, "mamba2": self._mamba2}[layer.kind]
        outs, states = step(layer, q, k, v, gates, state)
        out = torch.stack(outs, dim=1)  # [bs, L, Hv, V]
        self._write(layer.layer_id, seq, [self._to_pool(layer, s) for s in states])
        return torch.cat([out[i, :n] for i, n in enumerate(self.lens)]).to(projected.dtype)

    @staticmethod
    def _from_pool(layer, state):
        """States as the pool lays them out, [bs, Hv, V, K], -> [bs, Hv, K, V] (and back)."""
        return state.transpose(-1, -2)

    _to_pool = _from_pool

    def _scan(self, state, update, output, longest):
        """Every token column: each live request's state updated, then read; (outputs, states) per column."""
        outs, states = [], []
        for t in range(longest):
            state = torch.where((t < self.lens_tensor).view(-1, 1, 1, 1), update(state, t), state)
            states.append(state)
            outs.append(output(state, t))
        return outs, states

    def _gdn(self, layer, q, k, v, gates, state):
        a, b = gates
        decay = torch.exp(-layer.A_log.float().exp() * F.softplus(a + layer.dt_bias.float()))  # [bs, L, Hv]
        return self._delta(layer, q, k, v, decay[..., None].expand(-1, -1, -1, layer.head_k_dim), b, state)

    def _kda(self, layer, q, k, v, gates, state):
        g, b = gates
        g = (g + layer.dt_bias.float()).unflatten(-1, (layer.num_v_heads, layer.head_k_dim))
        decay = torch.exp(-layer.A_log.float().exp()[:, None] * F.softplus(g))  # [bs, L, Hv, K]
        return self._delta(layer, q, k, v, decay, b, state)

    def _delta(self, layer, q, k, v, decay, b, state):
        """GDN's and KDA's delta rule, decay [bs, L, Hv, K] (GDN's the same along K)."""
        q, k = self._qk(q, k, layer.num_v_heads // layer.num_k_heads)
        beta = torch.sigmoid(b)
        return self._scan(state, lambda s, t: self._update(s, k[:, t], v[:, t], decay[:, t], beta[:, t]),
                          lambda s, t: torch.einsum("bhk,bhkv->bhv", q[:, t], s), q.shape[1])

    def _mamba2(self, layer, c, b, x, gates, state):
        group = layer.num_v_heads // layer.num_k_heads
        c, b = c.repeat_interleave(group, dim=2), b.repeat_interleave(group, dim=2)
        dt = F.softplus(gates[0] + layer.dt_bias.float())  # [bs, L, H]
        decay = torch.exp(-layer.A_log.float().exp() * dt)
        skip = layer.D.float()[:, None]
        return self._scan(state, lambda s, t: self._ssm_update(s, b[:, t], x[:, t], decay[:, t], dt[:, t]),
                          lambda s, t: torch.einsum("bhn,bhnp->bhp", c[:, t], s) + skip * x[:, t], c.shape[1])

    @staticmethod
    def _ssm_update(state, b, x, decay, dt):
        """One token of Mamba2's SSD on [bs, H, N, P] states: h = exp(dt A) h + dt B x^T."""
        return state * decay[:, :, None, None] + (dt[:, :, None] * b)[:, :, :, None] * x[:, :, None, :]

    @staticmethod
    def _qk(q, k, group):
        """q and k [bs, L, Hk, K] L2-normalized per head (q scaled by K^-0.5), one per value head."""
        q = F.normalize(q, dim=-1) * q.shape[-1] ** -0.5
        return q.repeat_interleave(group, dim=2), F.normalize(k, dim=-1).repeat_interleave(group, dim=2)

    @staticmethod
    def _update(state, k, v, decay, beta):
        """One token's delta rule on [bs, Hv, K, V] states: decay (per key channel), then write
        beta (v - k^T S) along k."""
        state = state * decay[..., None]
        err = v - torch.einsum("bhk,bhkv->bhv", k, state)
        return state + torch.einsum("bhk,bhv->bhkv", k, err * beta[:, :, None])

    def _write(self, layer_id: int, seq: torch.Tensor, states) -> None:
        width = seq.shape[2] - max(self.lens) + 1
        real, slots = self.real, self.slots[self.real]
        if self.verify:
            for j in range(max(self.lens)):
                self.pool.intermediate_ssm(layer_id)[real, j] = states[j][real]
                window = seq[real, :, j + 1:j + width]
                self.pool.intermediate_conv(layer_id)[real, j] = window.to(self.pool.conv(layer_id).dtype)
        rows = self.rows
        ends = [self.lens[i] for i in rows]
        if rows and not self.verify:
            self.pool.temporal(layer_id)[slots] = torch.stack([states[n - 1][i] for i, n in zip(rows, ends)])
        if rows:
            windows = torch.stack([seq[i, :, n:n + width - 1] for i, n in zip(rows, ends)])
            self.pool.conv(layer_id)[slots] = windows.to(self.pool.conv(layer_id).dtype)
