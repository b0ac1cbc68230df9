"""Real-code mutants of vLLM's recurrent backends: a one-line patch of a copy of a vllm function
(tests.mutants.patching), wired into the adapter's builder without touching the installed one. Line
numbers are vllm 0.33.0's; a patch whose line no longer reads as expected raises, naming it."""
from __future__ import annotations

from backends.vllm.gdn import VllmGdnBackend
from backends.vllm.mamba2 import VllmMamba2Backend
from kit.modes import Exec, ForwardMode
from kit.mutation import Mutant
from kit.report.record import KERNEL, KV_WRITE
from tests.mutants import patching

MAMBA_ATTN = "vllm.v1.attention.backends.mamba_attn"
GDN_ATTN = "vllm.v1.attention.backends.gdn_attn"


class _Mamba2BuilderMutant(VllmMamba2Backend):
    """Mamba2AttentionMetadataBuilder whose common metadata (BaseMambaAttentionMetadataBuilder.
    _compute_common_metadata) is a copy with the line `patch` = (line, old, new)."""

    patch = (0, "", "")

    def builder_cls(self):
        compute = patching.patched_function(MAMBA_ATTN, "BaseMambaAttentionMetadataBuilder._compute_common_metadata",
                                            *self.patch)
        original = super().builder_cls()
        return type(original.__name__, (original,), {"_compute_common_metadata": compute})


class Mamba2InitialStatesOfTheFirstRows(_Mamba2BuilderMutant):
    """Whether a prefill row loads its saved state is read from the step's first rows, not its prefill
    rows past the decodes: right where no decode row comes first, wrong in the decode-first order
    vLLM's runner hands a mixed step (a new request behind a decode loads the slot's stale state)."""

    patch = (506, "num_computed_tokens[num_reqs - num_prefills : num_reqs] > 0",
             "num_computed_tokens[:num_prefills] > 0")


class GdnPrefillInitialStatesOfTheFirstRows(VllmGdnBackend):
    """GDNAttentionMetadataBuilder.build (a copy) taking its prefill rows' has-a-saved-state flags from the
    step's first rows, not the rows past its decodes: in the decode-first order vLLM's runner hands a
    mixed step, a new request behind the decodes loads its slot's stale state."""

    def builder_cls(self):
        build = patching.patched_function(GDN_ATTN, "GDNAttentionMetadataBuilder.build", 572,
                                          "prefill_has_initial_state = has_initial_state[num_decodes:]",
                                          "prefill_has_initial_state = has_initial_state[:num_prefills]")
        original = super().builder_cls()
        return type(original.__name__, (original,), {"build": build})


MX = ForwardMode.MIXED
V = "tests.mutants.vllm_linear:"
# Rows of the mutant catalog (tests/mutants/__init__.py), numbered from 140. On CPU vLLM's Mamba2 and GDN
# layers do not run (their supports()): tests/test_vllm_mamba2.py and tests/test_vllm_gdn.py catch mutants
# 140 and 141 in vLLM's builders there.
MUTANTS = [
    Mutant(140, "vllm_mamba2_initial_states_of_first_rows", V + "Mamba2InitialStatesOfTheFirstRows",
           (KERNEL, KV_WRITE), (MX,), (Exec.EAGER,), cpu=False),
    Mutant(141, "vllm_gdn_prefill_initial_states_of_first_rows", V + "GdnPrefillInitialStatesOfTheFirstRows",
           (KERNEL, KV_WRITE), (MX,), (Exec.EAGER,), cpu=False),
]
