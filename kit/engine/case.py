"""A case: one declarative line describing a batch and a layer to test."""
from __future__ import annotations

import dataclasses
import functools
import sys
import zlib
from typing import TYPE_CHECKING, Optional, Tuple, Union

from kit.engine.batch_shape import BatchShape
from kit.engine.kinds import KINDS, kind_of, parameters as kind_parameters
from kit.engine.layouts import LAYOUTS, PAGE_LAYOUTS
from kit.engine.modes import rules_for
from kit.modes import ForwardMode

if TYPE_CHECKING:
    import torch

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # torch's dtypes, by name, the exact one first
KV_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}  # quantized KV caches (kit.engine.kv_quant)
# How forward() is handed q, k and v: views of one fused QKV projection row per token, as
# models pass them (head stride D, token stride the row's width), or tensors of their own.
INPUT_FORMS = ("contiguous", "fused_qkv")

# (num_q_heads, num_kv_heads) presets
MHA = (8, 8)
GQA = (8, 2)
MQA = (8, 1)
GQA_32_8 = (32, 8)
GPT_OSS = (64, 8)  # gpt-oss-120b on one GPU: 64 query heads of 64, 8 KV heads
# The smoke set's (CPU) heads: the fewest that keep each shape what it is (two KV heads, so a query
# head read against the wrong KV head shows; query groups of one, two and four), since Triton's
# interpreter runs one program per head, one after another. The full set has the models' heads.
SMOKE_MHA, SMOKE_GQA, SMOKE_MQA = (2, 2), (4, 2), (4, 1)
# MLA (DeepSeek-V2/V3): 128 query heads on one GPU, 16 per rank on 8; one latent KV head
MLA_128, MLA_16 = (128, 1), (16, 1)
DEEPSEEK_RANK, DEEPSEEK_ROPE = 512, 64
DEEPSEEK_SCALE = (128 + 64) ** -0.5  # qk_head_dim = qk_nope_head_dim + qk_rope_head_dim, not the latent's 576
# The named values a case line may use (kit.engine.case_line reads lines by this table).
PRESETS = dict(MHA=MHA, GQA=GQA, MQA=MQA, GQA_32_8=GQA_32_8, GPT_OSS=GPT_OSS, SMOKE_MHA=SMOKE_MHA, SMOKE_GQA=SMOKE_GQA,
               SMOKE_MQA=SMOKE_MQA, MLA_128=MLA_128, MLA_16=MLA_16, DEEPSEEK_RANK=DEEPSEEK_RANK,
               DEEPSEEK_ROPE=DEEPSEEK_ROPE, DEEPSEEK_SCALE=DEEPSEEK_SCALE)


def _with_kind_parameters(cls):
    """The attention kinds' own parameters (kit.engine.kinds: MLA's kv_lora_rank and rope_dim,
    sparse MLA's index_topk and index_scatter) as the case's last fields, keyword-only, each at its
    kind's default: a new kind's parameters are its file's, and case lines name them as any field."""
    for name, default in kind_parameters():
        cls.__annotations__[name] = type(default).__name__
        setattr(cls, name, dataclasses.field(default=default, kw_only=True))
    return cls


@dataclasses.dataclass(frozen=True)
@_with_kind_parameters
class Case(BatchShape):
    """One batch shape + layer config for one runner mode; its attention kind's parameters are the
    kind's (kit.engine.kinds), fields after these.

    prefix: per request, the tokens whose KV is already in the pool
            (DECODE: seq_len - 1; EXTEND, MIXED: extend_prefix_lens;
            TARGET_VERIFY, DRAFT_DECODE: seq_lens; DRAFT_EXTEND_V2: seq_lens - drafts).
    new:    EXTEND, MIXED: per-request extend lengths (ragged; MIXED's decode rows 1);
            TARGET_VERIFY, DRAFT_EXTEND_V2 and DRAFT_DECODE: the server's draft token
            count; DECODE: 1.
    """

    name: str
    mode: ForwardMode
    prefix: Tuple[int, ...]
    new: Union[int, Tuple[int, ...]] = 1
    page: int = 1
    heads: Tuple[int, int] = GQA
    head_dim: int = 128
    dtype: str = "bf16"
    window: int = -1  # sliding window W: a query at p sees keys p-W..p
    cap: float = 0.0  # logit soft cap, 0 = off
    scale: Optional[float] = None  # sm_scale, None = 1/sqrt(head_dim)
    topk: int = 1  # TARGET_VERIFY: 1 = chain, >1 = tree
    layout: str = "contiguous"
    seed: int = 0
    # The model's other layer (layer 0, run first each step) has another config: no window
    # if this case has one (else a window of 8), half the scale, and the cap off (else 10).
    # Otherwise it repeats this case's config (kit.engine.layer.model_layers).
    hybrid: bool = False
    # Attention sinks (gpt-oss): every layer has a learned logit per query head that joins the
    # softmax denominator and carries no value (kit.engine.layer.sink_logits; each layer its own).
    sinks: bool = False
    inputs: str = "contiguous"  # INPUT_FORMS (kit.engine.fixture.LayerInputs.handed)
    # The KV cache's dtype: None stores K/V in `dtype`; "fp8_e4m3" / "fp8_e5m2" store them
    # quantized with per-layer scales on the layer (kit.engine.kv_quant).
    kv_dtype: Optional[str] = None
    # Each request's data seed (kit.engine.inputs: its queries, keys and values); None: derived from
    # the case's. A request given the same seed and lengths in another case has the same inputs, bit
    # for bit, wherever it sits in its batch.
    request_seeds: Optional[Tuple[int, ...]] = None
    # The speculative modes: the EAGLE draft's steps (SGLang's speculative_num_steps; DRAFT_DECODE's
    # forwards are steps - 1). None: new - 1, what a chain (topk 1) always has; a tree may set another.
    # MIXED: the drafts each decode row verifies (its decode rows 1 + steps tokens); None: none.
    steps: Optional[int] = None
    # The model's context length is the run's longest committed sequence (seq_lens), so that its
    # longest requests sit at the model's limit, whatever the mode writes past them (drafts) in the
    # req_to_token rows' headroom (sgl-project/sglang#29695); else the rows' width (no headroom).
    context_edge: bool = False

    def __post_init__(self):
        problem = self._problem()
        if problem:
            raise ValueError(f"{_declared_at(self)}: case {self.name!r}: {problem}")

    def _problem(self) -> Optional[str]:
        """What is wrong with this line, or None: caught here, not later inside the kit or a backend."""
        if not isinstance(self.name, str) or not self.name or "-" in self.name or " " in self.name:
            return "use letters, digits and _ in the name (test ids split on '-')"
        if not isinstance(self.mode, ForwardMode):
            return f"mode {self.mode!r} is not a ForwardMode (e.g. ForwardMode.DECODE)"
        if self.dtype not in DTYPES:
            return f"dtype {self.dtype!r} not in {list(DTYPES)}"
        if self.layout not in LAYOUTS:
            return f"layout {self.layout!r} not in {LAYOUTS}"
        if self.inputs not in INPUT_FORMS:
            return f"inputs {self.inputs!r} not in {INPUT_FORMS}"
        if not _is_int(self.page) or self.page < 1:
            return f"page {self.page!r} must be an int >= 1"
        if not isinstance(self.prefix, (tuple, list)) or not self.prefix or not all(
                _is_int(p) and p >= 0 for p in self.prefix):
            return f"bad prefix lengths {self.prefix!r}: one int >= 0 per request"
        if not (_is_int(self.new) or isinstance(self.new, (tuple, list)) and all(_is_int(n) for n in self.new)):
            return f"new {self.new!r} must be an int or one int per request"
        if (not isinstance(self.heads, tuple) or len(self.heads) != 2 or not all(_is_int(h) and h >= 1 for h in self.heads)
                or self.heads[0] % self.heads[1]):
            return f"heads {self.heads!r} must be (q, kv) ints >= 1 with kv dividing q"
        if not _is_int(self.head_dim) or self.head_dim < 1:
            return f"head_dim {self.head_dim!r} must be an int >= 1"
        if not _is_int(self.topk) or self.topk < 1:
            return f"topk {self.topk!r} must be an int >= 1"
        if not _is_int(self.window) or self.window < -1:
            return f"window {self.window!r} must be an int >= 0, or -1 for none"
        if not _is_number(self.cap) or self.cap < 0:
            return f"cap {self.cap!r} must be a number >= 0 (0: no cap)"
        if self.scale is not None and (not _is_number(self.scale) or self.scale <= 0):
            return f"scale {self.scale!r} must be a number > 0, or None for 1/sqrt(head_dim)"
        if self.kv_dtype is not None and self.kv_dtype not in KV_DTYPES:
            return f"kv_dtype {self.kv_dtype!r} not in {[None] + list(KV_DTYPES)} (None: the KV cache in `dtype`)"
        if not isinstance(self.sinks, bool):
            return f"sinks {self.sinks!r} must be True or False"
        if not isinstance(self.context_edge, bool):
            return f"context_edge {self.context_edge!r} must be True or False"
        if self.steps is not None and (not _is_int(self.steps) or self.steps < 1):
            return f"steps {self.steps!r} must be None or an int >= 1"
        if self.request_seeds is not None and (not isinstance(self.request_seeds, tuple) or len(
                self.request_seeds) != len(self.prefix) or not all(_is_int(s) and s >= 0 for s in self.request_seeds)):
            return f"request_seeds {self.request_seeds!r} must be None or one int >= 0 per request"
        return self._kind_problem() or rules_for(self.mode).validate(self)

    def _kind_problem(self) -> Optional[str]:
        for any_kind in KINDS.values():
            problem = any_kind.values(self)
            if problem:
                return problem
        kind = kind_of(self)
        for other in reversed(KINDS.values()):  # a field of several kinds names the plainest (MLA's rank)
            stray = [f for f in other.fields if f not in kind.fields and getattr(self, f)]
            if other is not kind and stray:
                return f"{', '.join(stray)} applies to {other.label} only (set {' and '.join(other.fields)})"
        return kind.problem(self)

    @property
    def num_q_heads(self) -> int:
        return self.heads[0]

    @property
    def size(self) -> int:
        """How much attention its batch computes (tokens x query heads x head_dim): to order cases
        smallest first where any of them will do."""
        return (sum(self.prefix) + sum(self.new_lens)) * self.num_q_heads * self.head_dim

    @property
    def num_kv_heads(self) -> int:
        return self.heads[1]

    @property
    def is_mla(self) -> bool:
        """Latent KV (MLA, sparse MLA too): one latent row per token, V its leading columns."""
        return self.kv_lora_rank > 0

    @property
    def kind(self) -> str:
        """The attention kind a backend declares support for (AttentionBackend.attention_kinds)."""
        return kind_of(self).name

    @property
    def geometry(self):
        """One layer's KV as the pool holds it (kit.engine.kinds.Geometry)."""
        return kind_of(self).geometry(self)

    @property
    def features(self) -> Tuple[str, ...]:
        """The layer features a backend declares support for (AttentionBackend.attention_features)."""
        return ("sinks",) if self.sinks else ()

    @property
    def v_head_dim(self) -> int:
        """Width of V and of each head's output (MLA: the latent's kv_lora_rank)."""
        return self.geometry.v_width

    @property
    def torch_dtype(self) -> "torch.dtype":
        import torch  # here: importing a case (the plugin does) must not import torch
        return getattr(torch, DTYPES[self.dtype])

    @property
    def kv_torch_dtype(self) -> "torch.dtype":
        """The KV pool's dtype: the case's, or the quantized one."""
        import torch
        return self.torch_dtype if self.kv_dtype is None else getattr(torch, KV_DTYPES[self.kv_dtype])

    @property
    def sm_scale(self) -> float:
        return self.scale if self.scale is not None else self.head_dim ** -0.5

    @property
    def kernel_variant(self) -> str:
        """What commonly selects a backend's compiled kernel (a JIT build, a Triton
        specialization): dtype, head_dim, GQA group, page size, and whether window, cap,
        a second layer config (hybrid), sinks or a tree mask are on; MLA's rank and rope width; a quantized KV
        cache. kit.plugin.grouping groups runs by it, so that a worker loads each kernel once."""
        flags = "".join(f"-{name}" for name, on in (("window", self.window >= 0), ("cap", self.cap > 0),
                                                     ("hybrid", self.hybrid), ("sinks", self.sinks),
                                                     ("tree", self.topk > 1),
                                                     (kind_of(self).variant_tag(self), kind_of(self).variant_tag(self)),
                                                     (f"kv{self.kv_dtype}", self.kv_dtype is not None)) if on)
        return f"{self.dtype}-d{self.head_dim}-g{self.heads[0] // self.heads[1]}-p{self.page}{flags}"

    def rng_seed(self, salt: int = 0) -> int:
        """Deterministic across processes (xdist workers must agree)."""
        return zlib.crc32(f"{self.mode.value}/{self.name}/{self.seed}/{salt}".encode())

    def request_seed(self, i: int) -> int:
        """The seed of request i: its data (kit.engine.inputs) and its shape's draws (a draft tree),
        wherever it is batched."""
        if self.request_seeds is not None:
            return self.request_seeds[i]
        return zlib.crc32(f"{self.rng_seed()}/request{i}".encode())

    def with_(self, **changes) -> "Case":
        return dataclasses.replace(self, **changes)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_NOT_THE_DECLARATION = (__file__, dataclasses.__file__, functools.__file__)


def _declared_at(case) -> str:
    """file:line of the Case(...) call being validated (the first frame outside the case's own
    generated __init__, dataclasses, functools.partial and this module): where to fix the line."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename in _NOT_THE_DECLARATION
                                 or frame.f_locals.get("self") is case):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "<unknown>"


def in_every_layout(cases):
    """Each case once per layout (SPEC: every mode runs on every layout)."""
    return [c.with_(name=c.name + layout.suffix, layout=layout.name) for c in cases for layout in PAGE_LAYOUTS.values()]
