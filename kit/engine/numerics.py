"""A backend's declared numerics: the rounding steps it takes on purpose, which an exact float64
reference would count as its error. Each step is declared for the modes it is taken in (a tuple
of ForwardMode values; ALL for every mode) and applies to a case only where its precision is the
case's (the fp8 steps with a quantized KV cache, TF32 with fp32 inputs):

- `q_fp8`: the query quantized to the KV cache's fp8 type with q_scale = k_scale before QK
  (vLLM's `supports_quant_query_input` backends);
- `q_cast`: the query cast to the KV cache's fp8 type, no scale, where it meets a key the cache
  holds (SGLang's Triton kernels: `q.to(k.dtype)` before an fp8 x fp8 dot);
- `new_tokens_as_handed`: the step's own new tokens attended as forward() was handed them, not as
  the quantized cache stores them (SGLang's extend kernels read k/v, not the pool), by the query
  as handed;
- `rope_as_handed` (MLA, with q_fp8 or q_cast): the query's rope columns meet the keys' as handed,
  only its latent columns quantized (SGLang's grouped decode splits the rope dot off, its query
  uncast: decode_attention.py:692);
- `p_fp8`: the softmax probabilities scaled by 2^8 and quantized to fp8 e4m3 before the PV
  product (FA3; vLLM's Triton kernel);
- `p_cast`: the probabilities cast to the KV cache's fp8 type, no scale, before the PV product
  (SGLang's Triton kernels: `p.to(v.dtype)`);
- `p_half`: each probability exp(s - max) rounded to the model's dtype (fp16, bf16) before the PV product
  and before the row sum that divides the output, so the log-sum-exp is that rounded sum's (FlashInfer's
  prefill kernels, which its tensor-core decode and its sink variant run too: prefill.cuh casts the
  scores to DTypeQ and sums them with m16k16_rowsum_f16f16f32); a sink's term joins the sum unrounded;
- `tf32_dots`: fp32 dot products on TF32 inputs (Triton's tl.dot on NVIDIA by default);
- `conv_products` (recurrent kinds): each conv tap's product x * w rounded to the model's dtype before
  the float32 sum (Triton multiplies two half-precision loads in their dtype: both engines'
  causal_conv1d_fn and causal_conv1d_update kernels, `acc += matrix_x * matrix_w`);
- `conv_cast` (recurrent kinds): the causal conv's SiLU output stored in the model's dtype before the
  recurrence reads it (both engines' causal_conv1d kernels write mixed_qkv / xBC in the input dtype);
- `qk_cast` (GDN, KDA, in PREFILL modes): the l2-normalized q and k stored in the model's dtype (vLLM's
  and fla's l2norm_fwd, run before the chunk kernel; the decode kernels normalize inside, in float32);
- `state_cast` (recurrent kinds): the chunked prefill kernels' in-tile casts to the model's dtype.
  GDN, KDA: the state where it meets q in a tensor-core dot (the chunked kernels' `h` and the output
  of each chunk). Mamba2: its chunked SSD as both engines' Triton kernels run it (chunks of
  mamba_chunk_size, kit.engine.recurrent_reference.ssd_chunks): B scaled by its decay and dt before
  the dot with x (chunk_state), C B^T scaled likewise before the dot with x (chunk_scan) and the
  chunk's starting state where it meets C; its states carry the first.
The recurrent casts apply to fp16 and bf16 cases (a cast to fp32 is none).

`cuda_only` names the steps an engine takes on CUDA devices only (it picks them by platform: on
CPU, Triton's interpreter computes fp32 dots in fp32, vLLM quantizes no query). `grouped_only` names
the modes in which it takes its steps only where query heads share a KV head (MQA, GQA, MLA): SGLang
hands a decode of one query head per KV head to a kernel of float32 sums, no fp8 cast and no dot
(decode_attention.py:1269, :389).

The first four, and conv_products, conv_cast and qk_cast, are emulated exactly (kit.engine.reference.declared;
kit.engine.recurrent_reference): a run is judged against the
float64 reference that takes them. p_fp8, p_cast, p_half, tf32_dots and state_cast round inside the kernel's tiles, where an
emulation cannot follow each tile's running maximum or the hardware's rounding: they widen the
tolerance by what they cost the float64 reference (its envelope), as FlashAttention's tests
accept twice a same-precision reference's error."""
from __future__ import annotations

import dataclasses
from typing import Tuple

from kit.modes import MODES

ALL = tuple(m.value for m in MODES)
# The modes a recurrent layer runs its chunked prefill kernels in (decode and verify rows take the fused
# recurrent kernels, which l2-normalize q and k inside, in float32).
PREFILL = ("extend", "mixed")
Q_FP8, Q_CAST, NEW_AS_HANDED, ROPE_AS_HANDED = "q fp8", "q cast to fp8", "new tokens as handed", "rope as handed"
P_FP8, P_CAST, P_HALF, TF32 = "p fp8", "p cast to fp8", "p and its sum in the model's dtype", "tf32 dots"
CONV_PRODUCTS, CONV_CAST = "conv products cast", "conv output cast"
QK_CAST, STATE_CAST = "q k cast", "state cast at the output"
STEPS = (Q_FP8, Q_CAST, NEW_AS_HANDED, ROPE_AS_HANDED, P_FP8, P_CAST, P_HALF, TF32, CONV_PRODUCTS, CONV_CAST,
         QK_CAST, STATE_CAST)
RECURRENT_CASTS = (CONV_PRODUCTS, CONV_CAST, QK_CAST, STATE_CAST)  # the steps a recurrent reference takes (kit.engine.recurrent_reference)
ENVELOPE_STEPS = (P_FP8, P_CAST, P_HALF, TF32, STATE_CAST)  # they widen the tolerance by their cost to the reference; the others
# the float64 reference takes exactly
EXACT = "exact"  # the label of numerics that take no step


@dataclasses.dataclass(frozen=True)
class Numerics:
    q_fp8: Tuple[str, ...] = ()
    q_cast: Tuple[str, ...] = ()
    new_tokens_as_handed: Tuple[str, ...] = ()
    rope_as_handed: Tuple[str, ...] = ()
    p_fp8: Tuple[str, ...] = ()
    p_cast: Tuple[str, ...] = ()
    p_half: Tuple[str, ...] = ()
    tf32_dots: Tuple[str, ...] = ()
    conv_products: Tuple[str, ...] = ()
    conv_cast: Tuple[str, ...] = ()
    qk_cast: Tuple[str, ...] = ()
    state_cast: Tuple[str, ...] = ()
    grouped_only: Tuple[str, ...] = ()  # modes
    cuda_only: Tuple[str, ...] = ()  # of STEPS

    def problem(self) -> str:
        """Why the declaration is malformed ('' when it is not)."""
        if isinstance(self.cuda_only, str) or not isinstance(self.cuda_only, tuple) or not set(self.cuda_only) <= set(STEPS):
            return f"cuda_only must be a tuple of step names (of {', '.join(map(repr, STEPS))}), not {self.cuda_only!r}"
        if self.q_fp8 and self.q_cast and set(self.q_fp8) & set(self.q_cast):
            return "q_fp8 and q_cast name the same modes: a query is quantized one way"
        if set(self.p_fp8) & set(self.p_cast) or set(self.p_fp8 + self.p_cast) & set(self.p_half):
            return "p_fp8, p_cast and p_half name the same modes: probabilities are rounded one way"
        for field in dataclasses.fields(self)[:-1]:
            modes = getattr(self, field.name)
            if isinstance(modes, str) or not isinstance(modes, tuple) or not set(modes) <= set(ALL):
                return (f"{field.name} must be a tuple of mode values (of {', '.join(ALL)}; "
                        f"kit.engine.numerics.ALL for every mode), not {modes!r}")
        if not set(self.rope_as_handed) <= set(self.q_fp8) | set(self.q_cast):
            return ("rope_as_handed names modes whose query is not quantized (q_fp8 or q_cast): "
                    "its rope is handed anyway")
        return ""

    def steps(self, mode: str, dtype: str, kv_dtype, device_type: str, *, grouped: bool,
              latent: bool) -> Tuple[str, ...]:
        """The declared steps a run of (mode, case dtype, case kv_dtype) on a device of `device_type`
        ("cpu", "cuda") takes, in STEPS order; `grouped`: the case's query heads share a KV head,
        `latent`: its attention is MLA's."""
        if mode in self.grouped_only and not grouped:
            return ()
        quantized, half = kv_dtype is not None, dtype in ("bf16", "fp16")
        q_quantized = quantized and mode in self.q_fp8 + self.q_cast
        taken = ((Q_FP8, quantized and mode in self.q_fp8), (Q_CAST, quantized and mode in self.q_cast),
                 (NEW_AS_HANDED, quantized and mode in self.new_tokens_as_handed),
                 (ROPE_AS_HANDED, q_quantized and latent and mode in self.rope_as_handed),
                 (P_FP8, quantized and mode in self.p_fp8), (P_CAST, quantized and mode in self.p_cast),
                 (P_HALF, half and mode in self.p_half),
                 (TF32, dtype == "fp32" and mode in self.tf32_dots),
                 (CONV_PRODUCTS, half and mode in self.conv_products), (CONV_CAST, half and mode in self.conv_cast),
                 (QK_CAST, half and mode in self.qk_cast), (STATE_CAST, half and mode in self.state_cast))
        return tuple(step for step, on in taken if on and (device_type == "cuda" or step not in self.cuda_only))

    def case_steps(self, case, device_type: str, mode: str = "") -> Tuple[str, ...]:
        """steps() of a run of `case` (kit.engine.case.Case) on a device of `device_type`, in `mode` (the
        case's unless given: a request an engine runs in another mode's kernels)."""
        return self.steps(mode or case.mode.value, case.dtype, case.kv_dtype, device_type,
                          grouped=case.num_q_heads > case.num_kv_heads, latent=case.is_mla)


EXACT_NUMERICS = Numerics()


def composed(*parts: Numerics) -> Numerics:
    """The numerics of a backend composed of others (a hybrid model's: its full side's and its linear
    side's): every step any part takes, in the modes it takes it. grouped_only is the parts' too: the
    recurrent harness takes its steps as grouped, so it gates the full-attention side's alone."""
    return Numerics(**{field.name: tuple(dict.fromkeys(m for part in parts for m in getattr(part, field.name)))
                       for field in dataclasses.fields(Numerics)})


def label(steps: Tuple[str, ...]) -> str:
    """How records and tables name the numerics a run was judged under."""
    return ", ".join(steps) if steps else EXACT
