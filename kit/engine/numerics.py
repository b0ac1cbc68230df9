"""A backend's declared numerics: the rounding steps it takes on purpose, which an exact float64
reference would count as its error. Each step is declared for the modes it is taken in (a tuple
of ForwardMode values; ALL for every mode) and applies to a case only where its precision is the
case's (the fp8 steps with a quantized KV cache, TF32 with fp32 inputs):

- `q_fp8`: the query quantized to the KV cache's fp8 type with q_scale = k_scale before QK
  (vLLM's `supports_quant_query_input` backends);
- `new_tokens_as_handed`: the step's own new tokens attended as forward() was handed them, not as
  the quantized cache stores them (SGLang's extend kernels read k/v, not the pool);
- `p_fp8`: the softmax probabilities quantized to fp8 e4m3 before the PV product (FA3);
- `tf32_dots`: fp32 dot products on TF32 inputs (Triton's tl.dot on NVIDIA by default).

The first two are emulated exactly (kit.engine.reference.declared): a run is judged against the
float64 reference that takes them. The last two round inside the kernel's tiles, where an
emulation cannot follow each tile's running maximum or the hardware's rounding: they widen the
tolerance by what they cost the float64 reference (its envelope), as FlashAttention's tests
accept twice a same-precision reference's error."""
from __future__ import annotations

import dataclasses
from typing import Tuple

from kit.modes import MODES

ALL = tuple(m.value for m in MODES)
Q_FP8, NEW_AS_HANDED, P_FP8, TF32 = "q fp8", "new tokens as handed", "p fp8", "tf32 dots"
EMULATED_STEPS = (Q_FP8, NEW_AS_HANDED)  # the float64 reference takes them exactly
ENVELOPE_STEPS = (P_FP8, TF32)  # they widen the tolerance by their cost to the reference
EXACT = "exact"  # the label of numerics that take no step


@dataclasses.dataclass(frozen=True)
class Numerics:
    q_fp8: Tuple[str, ...] = ()
    new_tokens_as_handed: Tuple[str, ...] = ()
    p_fp8: Tuple[str, ...] = ()
    tf32_dots: Tuple[str, ...] = ()

    def problem(self) -> str:
        """Why the declaration is malformed ('' when it is not)."""
        for field in dataclasses.fields(self):
            modes = getattr(self, field.name)
            if isinstance(modes, str) or not isinstance(modes, tuple) or not set(modes) <= set(ALL):
                return (f"{field.name} must be a tuple of mode values (of {', '.join(ALL)}; "
                        f"kit.engine.numerics.ALL for every mode), not {modes!r}")
        return ""

    def steps(self, mode: str, dtype: str, kv_dtype) -> Tuple[str, ...]:
        """The declared steps a run of (mode, case dtype, case kv_dtype) takes, in the order above."""
        quantized = kv_dtype is not None
        taken = ((Q_FP8, quantized and mode in self.q_fp8),
                 (NEW_AS_HANDED, quantized and mode in self.new_tokens_as_handed),
                 (P_FP8, quantized and mode in self.p_fp8),
                 (TF32, dtype == "fp32" and mode in self.tf32_dots))
        return tuple(step for step, on in taken if on)


EXACT_NUMERICS = Numerics()


def label(steps: Tuple[str, ...]) -> str:
    """How records and tables name the numerics a run was judged under."""
    return ", ".join(steps) if steps else EXACT
