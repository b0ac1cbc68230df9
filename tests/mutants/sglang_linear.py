"""Real-code mutants of SGLang's recurrent backends: a one-line patch of a copy of the sglang module
(tests.mutants.patching), wired into the adapter's backend without touching the installed one. Line
numbers are sglang 0.5.23's; a patch whose line no longer reads as expected raises, naming it."""
from __future__ import annotations

import types
from importlib import import_module

from backends.sglang.kda import KDA_BACKEND, SGLangKDABackend
from backends.sglang.mamba2 import MAMBA2_BACKEND, MIXER, SGLangMamba2Backend
from kit.modes import Exec, ForwardMode
from kit.mutation import Mutant
from kit.report.record import KERNEL, KV_WRITE
from tests.mutants import patching
from tests.mutants.sglang import patched_module

MAMBA2_METADATA = "sglang.srt.layers.attention.mamba.mamba2_metadata"


class _Mamba2MetadataMutant(SGLangMamba2Backend):
    """Mamba2AttnBackend whose metadata is built by a copy of mamba2_metadata.py's
    Mamba2Metadata.prepare_mixed with the line `patch` = (line, old, new)."""

    patch = (0, "", "")

    def _linear_backend(self, runner):
        backend = super()._linear_backend(runner)
        hybrid = import_module(MAMBA2_BACKEND)
        prepare_mixed = patching.patched_function(MAMBA2_METADATA, "Mamba2Metadata.prepare_mixed", *self.patch)
        metadata = type("Mamba2Metadata", (hybrid.Mamba2Metadata,), {"prepare_mixed": prepare_mixed})
        # The backend's own method, reading the patched class where it names Mamba2Metadata.
        init = patching.rebound(hybrid.Mamba2AttnBackend.init_forward_metadata, hybrid.__dict__,
                                Mamba2Metadata=metadata)
        backend.init_forward_metadata = types.MethodType(init, backend)
        return backend


class Mamba2InitialStatesOfTheFirstRequest(_Mamba2MetadataMutant):
    """Whether a prefill batch loads saved states at all is decided by its first request alone: behind a
    new request, a request continuing its saved state starts from zeros."""

    patch = (262, "prep_initial_states = torch.any(has_initial_states[:num_prefills]).item()",
             "prep_initial_states = torch.any(has_initial_states[:1]).item()")


class _MixerMutant(SGLangMamba2Backend):
    """MambaMixer2 from a copy of mamba.py with the line `patch` = (line, old, new)."""

    patch = (0, "", "")

    def _mixer_module(self):
        return patched_module(MIXER, *self.patch)


class Mamba2DecodeDtWithoutSoftplus(_MixerMutant):
    """The decode's selective_state_update takes dt + dt_bias as the step, without its softplus (the
    prefill's chunked scan applies it): every decode step decays and writes by the raw gate."""

    patch = (766, "dt_softplus=True,", "dt_softplus=False,")


class _KDAMutant(SGLangKDABackend):
    """KDAAttnBackend from a copy of kda_backend.py with the line `patch` = (line, old, new)."""

    patch = (0, "", "")

    def _impl_class(self):
        return patched_module(KDA_BACKEND, *self.patch).KDAAttnBackend


class KDADecodeScaledByValueWidth(_KDAMutant):
    """The decode scales q by the value head's width, not the key's: the same where they are equal
    (Kimi Linear's 128 and 128), wrong in any model whose widths differ."""

    patch = (979, "scale=layer.head_k_dim**-0.5,", "scale=layer.head_v_dim**-0.5,")


D, E, MX = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED
M = "tests.mutants.sglang_linear:"
# Rows of the mutant catalog (tests/mutants/__init__.py), numbered from 120. On CPU SGLang's Mamba2
# prefill does not run (SGLangMamba2Backend.supports): tests/test_sglang_linear.py catches mutant 120 in
# SGLang's metadata there.
MUTANTS = [
    Mutant(120, "sglang_mamba2_initial_states_of_first_request", M + "Mamba2InitialStatesOfTheFirstRequest",
           (KERNEL, KV_WRITE), (E, MX), (Exec.EAGER,), cpu=False),
    Mutant(121, "sglang_kda_decode_scaled_by_value_width", M + "KDADecodeScaledByValueWidth", (KERNEL,), (D,),
           (Exec.EAGER,), cpu=True),
    Mutant(122, "sglang_mamba2_decode_dt_without_softplus", M + "Mamba2DecodeDtWithoutSoftplus", (KERNEL, KV_WRITE),
           (D,), (Exec.EAGER,), cpu=True),
]
