"""Which speculative configurations an engine schedules: its draft rule, one function per engine,
which its profile names (kit.engine.profile.EngineProfile.drafts) and the kit asks with the
profile's other scheduling decisions (EngineProfile.unscheduled), once, where it decides whether a
backend runs a case (kit.harness.scope). A case line is checked only against what the modes
themselves need (kit.engine.modes.rules): a case an engine's rule refuses is its backends'
`unsupported`, not a malformed line. Imports no torch."""
from __future__ import annotations

from typing import Optional

from kit.modes import ForwardMode

# SGLang sets a chain's draft count to its steps + 1 (arg_groups/speculative_hook.py:1255-1266).
SGLANG_CHAIN_RULE = "SGLang's arg_groups/speculative_hook.py:1255"
# vLLM's drafter proposes its num_speculative_tokens in as many passes (the first, then
# num_speculative_tokens - 1 more: v1/spec_decode/llm_base_proposer.py:688), verified with the
# token before them: 1 + num_speculative_tokens.
VLLM_CHAIN_RULE = "vLLM's v1/spec_decode/llm_base_proposer.py:688"


def num_steps(case) -> int:
    """The EAGLE draft's steps of a speculative case: Case.steps, else a chain's new - 1."""
    return case.steps if case.steps is not None else case.new - 1


def chain_problem(case, rule: str) -> Optional[str]:
    """Why a chain's draft count is not its steps + 1, as the engine whose `rule` it cites sets
    it, or None (trees set their count apart from their steps)."""
    if case.topk == 1 and num_steps(case) != case.new - 1:
        return (f"a chain (topk 1) of {num_steps(case)} steps has steps + 1 = {num_steps(case) + 1} draft tokens, "
                f"not new={case.new}: the engine sets the count so ({rule}); leave steps out")
    return None


def sglang(case) -> Optional[str]:
    """SGLang's drafts: a chain's count its steps + 1; no DRAFT_DECODE tree at pages > 1."""
    problem = chain_problem(case, SGLANG_CHAIN_RULE)
    if problem is None and case.mode is ForwardMode.DRAFT_DECODE and case.topk > 1 and case.page > 1:
        problem = ("DRAFT_DECODE with topk > 1 at page > 1 is out of scope: SGLang copies each request's partial "
                   "last page into every lane before the draft (eagle_worker_common.py:308), a pool the kit's "
                   "plan does not hold")
    return problem


def vllm(case) -> Optional[str]:
    """vLLM's drafts: a chain's count its steps + 1."""
    return chain_problem(case, VLLM_CHAIN_RULE)
