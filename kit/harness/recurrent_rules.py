"""How an engine keeps a recurrent layer's states across a speculative verify (TARGET_VERIFY of a
chain of drafts), and where the next step continues from: one rule per engine, which its profile
names (`EngineProfile.recurrent_verify`, kit.engine.profile). The rule decides the pools' shape,
the state slots a request owns, where its saved state sits before the step, what the step writes
(kit.harness.state_checks judges it), and what happens between the verify and the next step.

- SGLang's (`INTERMEDIATE_POOLS`): a request owns one slot. A verify writes the state and window
  after each draft to the intermediate pools at (the request's batch position, draft): row i is
  request i's, whatever its slot (layers/attention/linear/utils.py
  build_verify_intermediate_state_indices; mamba/mamba.py's arange(num_decodes)), and leaves the
  slot's state as it was, its conv window slid over every draft (causal_conv1d_update writes the
  slot's window as a decode does, verify or not; the copy after the verify overwrites it); the
  scheduler then copies each request's last kept draft from its row into its slot
  (update_mamba_state_after_mtp_verify), and the next step reads the slot.
- vLLM's (`PER_TOKEN_BLOCKS`, v1/attention/backends/gdn_attn.py): a request owns 1 +
  num_speculative_tokens state blocks (its block-table row) and one conv window
  num_speculative_tokens columns wider, in its first block. A speculative step of T tokens reads
  the state in block `num_accepted_tokens - 1` (the previous step's count of kept tokens) and the
  window at that column offset, writes the state after its token t to block t, and the window
  `[the read window's last w - 2 columns, its T input rows]` to the first block's columns 0..w-3+T
  (causal_conv1d_update's sliding window). Nothing is copied: the next step is handed the verify's
  num_accepted_tokens and continues from there. Steps without drafts (DECODE, EXTEND, MIXED of a
  server without speculative decoding) read and write the first block, as SGLang's read the slot.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from kit.engine.profile import INTERMEDIATE_POOLS, PER_TOKEN_BLOCKS
from kit.engine.state_pool import StateLayout
from kit.harness.state_checks import Expected
from kit.modes import ForwardMode


def _as_pooled(state: torch.Tensor) -> torch.Tensor:
    """A state of the reference's [Hv, K, V] as the pool lays it out, [Hv, V, K]."""
    return state.transpose(-1, -2)


def _references(fx) -> List[List[tuple]]:
    """Per layer, per request: its (golden, same-dtype, envelope) runs (the envelope None where none is declared)."""
    envelopes = fx.envelope or [[None] * fx.case.bs] * len(fx.golden)
    return [list(zip(*layer)) for layer in zip(fx.golden, fx.same_dtype, envelopes)]


def _state(name: str, layer_id: int, index, runs: tuple, t: int) -> Expected:
    """The entry the state after token t of a request's `runs` (_references) is expected in."""
    golden, same, envelope = runs
    return Expected(name, layer_id, index, _as_pooled(golden.states[t]), _as_pooled(same.states[t]), exact=False,
                    envelope=None if envelope is None else _as_pooled(envelope.states[t]))


class IntermediatePools:
    """SGLang's rule."""

    name = INTERMEDIATE_POOLS

    @staticmethod
    def layout(case) -> Optional[StateLayout]:
        """The case's state layout (None: the fixture's default, this rule's)."""
        return None

    @staticmethod
    def next_layout(fx, accepted) -> Optional[StateLayout]:
        """The layout of the step after a verify."""
        return None

    @staticmethod
    def expected(fx, before_verify=None) -> List[Expected]:
        """The entries the step writes: each request's final state and window, or (verify) each draft's."""
        verify = fx.case.mode == ForwardMode.TARGET_VERIFY
        found = []
        for layer_id, references in enumerate(_references(fx)):
            for row, (slot, runs) in enumerate(zip(fx.slots, references)):
                golden = runs[0]
                drafts = range(len(golden.states)) if verify else [len(golden.states) - 1]
                for j in drafts:
                    index = (row, j) if verify else (slot,)
                    conv, temporal = ("intermediate_conv", "intermediate_ssm") if verify else ("conv", "temporal")
                    found.append(Expected(conv, layer_id, index, golden.windows[j], golden.windows[j], exact=True))
                    found.append(_state(temporal, layer_id, index, runs, j))
                if verify:
                    found.append(Expected("conv", layer_id, (slot,), golden.windows[-1], golden.windows[-1], exact=True))
        return found

    @staticmethod
    def after_verify(fx, pool, accepted) -> None:
        """Between the verify and the next step: the scheduler's copy of each kept draft from its row
        into its slot."""
        device = pool.device
        pool.commit(torch.tensor(fx.slots, device=device), torch.tensor(accepted, device=device))


class PerTokenBlocks:
    """vLLM's rule."""

    name = PER_TOKEN_BLOCKS

    @staticmethod
    def layout(case) -> Optional[StateLayout]:
        """A verify's requests own `new` blocks; each continues a step that kept some tokens: request i
        from the count its neighbour keeps after this one (the case's `accepted`, rotated), so that
        the offsets it reads at vary."""
        if case.mode != ForwardMode.TARGET_VERIFY:
            return None
        return StateLayout(blocks=case.new, spec_columns=case.new - 1,
                           accepted_before=tuple(case.accepted[1:] + case.accepted[:1]))

    @staticmethod
    def next_layout(fx, accepted) -> Optional[StateLayout]:
        return StateLayout(blocks=fx.layout.blocks, spec_columns=fx.layout.spec_columns, accepted_before=tuple(accepted))

    @staticmethod
    def expected(fx, before_verify=None) -> List[Expected]:
        """The step's writes. `before_verify`: for the step after a verify, the verify's fixture,
        whose wide window's columns past the new window this step leaves as they were."""
        verify = fx.case.mode == ForwardMode.TARGET_VERIFY
        width = fx.case.conv_width - 1
        found = []
        for layer_id, references in enumerate(_references(fx)):
            for i, (blocks, runs) in enumerate(zip(fx.blocks, references)):
                golden = runs[0]
                tokens = range(len(golden.states)) if verify else [len(golden.states) - 1]
                for t in tokens:
                    found.append(_state("temporal", layer_id, (blocks[t] if verify else blocks[0],), runs, t))
                if verify:
                    window = PerTokenBlocks._verify_window(fx, layer_id, i)
                elif before_verify is not None:
                    kept = PerTokenBlocks._verify_window(before_verify, layer_id, i)[:, width:]
                    window = torch.cat([golden.windows[-1], kept], dim=1)
                else:
                    window = golden.windows[-1]
                found.append(Expected("conv", layer_id, (blocks[0],), window, window, exact=True))
        return found

    @staticmethod
    def _verify_window(fx, layer_id: int, request: int) -> torch.Tensor:
        """The wide window a verify writes to a request's first block: the read window's last
        w - 2 columns, then the request's input rows."""
        start = fx.starts[layer_id][request]
        first = sum(fx.case.new_lens[:request])
        rows = fx.inputs[layer_id].rows[first:first + fx.case.new_lens[request]]
        return torch.cat([start.window[:, 1:], rows.t().double()], dim=1)

    @staticmethod
    def after_verify(fx, pool, accepted) -> None:
        """Nothing moves: the next step reads the blocks the verify wrote, by its num_accepted_tokens."""


RULES = {rule.name: rule for rule in (IntermediatePools, PerTokenBlocks)}


def rule_of(profile):
    """The verify rule an engine's profile names."""
    return RULES[profile.recurrent_verify]
