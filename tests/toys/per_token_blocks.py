"""A toy engine of vLLM's recurrent verify rule (kit.harness.recurrent_rules, PER_TOKEN_BLOCKS) over
the in-box torch_native_linear: a request's state blocks are its block-table row, a step continues
from block num_accepted_tokens - 1 and the conv window at that column, and a verify writes the state
after its token t to block t and the sliding window to the first block (vLLM's GDN kernels'
bookkeeping, in PyTorch). `ACCEPTED_OFFSET` is which block it reads: the planted bugs change it."""
from __future__ import annotations

import dataclasses

import torch

from backends.torch_native_linear import TorchNativeLinearBackend
from kit.engine.profile import PER_TOKEN_BLOCKS, SGLANG


class PerTokenBlocksLinear(TorchNativeLinearBackend):
    name = "per_token_blocks_linear"
    profile = dataclasses.replace(SGLANG, name="per-token blocks", recurrent_verify=PER_TOKEN_BLOCKS)
    accepted_offset = 1  # the block read: num_accepted_tokens - accepted_offset

    def __init__(self, ctx):
        super().__init__(ctx)
        self.width = ctx.layers[0].conv_weights.shape[1] - 1

    def init_forward_metadata(self, batch) -> None:
        super().init_forward_metadata(batch)
        self.blocks = batch.state_blocks
        if self.blocks is not None:
            self.at = (batch.num_accepted_tokens.long() - self.accepted_offset).clamp_min(0)

    def _start(self, pool):
        if self.blocks is None:
            return super()._start(pool)
        rows = torch.arange(len(self.lens))
        if pool.dim() == 3:  # the conv window, at its column offset in the first block
            columns = self.at[:, None] + torch.arange(self.width)
            held = pool[self.blocks[:, 0].long()][rows[:, None], :, columns].transpose(1, 2).float()
        else:
            held = pool[self.blocks.long()[rows, self.at]].float()
        return torch.where(self.saved.view(-1, *[1] * (held.dim() - 1)), held, torch.zeros_like(held))

    def _write(self, layer_id, seq, states) -> None:
        if self.blocks is None:
            return super()._write(layer_id, seq, states)
        conv, temporal = self.pool.conv(layer_id), self.pool.temporal(layer_id)
        for i, n in enumerate(self.lens):
            first = int(self.blocks[i, 0])
            if self.verify:
                for t in range(n):
                    temporal[int(self.blocks[i, t])] = states[t][i]
                conv[first] = seq[i, :, 1:1 + conv.shape[2]].to(conv.dtype)
            else:
                temporal[first] = states[n - 1][i]
                conv[first, :, :self.width] = seq[i, :, n:n + self.width].to(conv.dtype)


class ReadsFirstBlock(PerTokenBlocksLinear):
    """num_accepted_tokens ignored: every step continues from the first block (the last draft's offset lost)."""

    def init_forward_metadata(self, batch) -> None:
        super().init_forward_metadata(batch)
        if self.blocks is not None:
            self.at = torch.zeros_like(self.at)


class OneBlockPast(PerTokenBlocksLinear):
    """The state read one block past the kept token's (block num_accepted_tokens, not - 1)."""

    accepted_offset = 0

    def init_forward_metadata(self, batch) -> None:
        super().init_forward_metadata(batch)
        if self.blocks is not None:
            self.at = self.at.clamp_max(self.blocks.shape[1] - 1)
