"""Linear attention with a recurrent state (kit.engine.kinds.gdn, .mamba2, .kda): one
case line, and the layer forward() is handed.

Such a layer keeps no KV pages: per request it keeps a convolution window (the last `conv_width - 1`
rows of its input projection, before the convolution) and a recurrent state per head, both in
slot-indexed pools (kit.engine.state_pool). A step hands the backend the projection [T, conv_dim]
before the causal conv1d and the kind's gate inputs [T, Hv] before their activations, as the
engines' backends take them; the layer holds the conv weights and the kind's parameters
(kit.engine.recurrent_step). Both kinds are written in one geometry: `heads` = (key heads, value
heads), `head_k_dim` the state's key width, `head_v_dim` its value width (Mamba2: groups, heads,
d_state and head_dim; its B is GDN's k, its C q, its x v).

`prefix` is what a request consumed before the step: its saved state is the state after those
tokens (0: a new request, whose slot holds whatever its last tenant left, and which must start from
zeros). TARGET_VERIFY verifies a chain of `new` drafts; `accepted` is how many of them each request
keeps, which the next step continues from (the engine's rollback rule, kit.harness.recurrent).
These cases are in the in-box catalog beside the softmax ones (cases/linear.py) and run through
kit.harness.recurrent, not the softmax runner: their inputs, reference and pools are of their own.

A hybrid model (Qwen3-Next: three linear layers, then a full-attention one) is a case with a
`layer_pattern`: per layer, LINEAR (the case's kind, its state in the state pools) or FULL (dense GQA
attention of `attention_heads` (q, kv) heads of `attention_head_dim`, its K/V in the KV pool, judged as
the softmax cases are: kit.harness.hybrid). Every layer takes the step's requests; the KV pool holds
the full layers alone (NUM_LAYERS of them), the state pools the linear ones.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Optional, Tuple, Union

from kit.engine.batch_shape import BatchShape
from kit.engine.kinds import gdn, kda, mamba2
from kit.engine.depth import NUM_LAYERS
from kit.modes import ForwardMode

KINDS = {kind.NAME: kind for kind in (gdn, mamba2, kda)}
MODES = (ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY)
# The modes both engines capture for GDN layers (decode and verify batches, per batch-size bucket).
GRAPH_MODES = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY)
DTYPES = ("bf16", "fp16", "fp32")
SMOKE_HEADS = (1, 2)  # the fewest that keep value heads sharing a key head
# The token chunk of the engines' chunked prefill kernels (fla's chunk_gated_delta_rule, chunk_kda,
# Mamba2's SSD scan): a request's new tokens past it run in a second chunk that starts from the first's state.
CHUNK = 64
LINEAR, FULL = "linear", "full"  # a hybrid model's layers (RecurrentCase.layer_pattern)
# What a backend serving a hybrid model declares (its attention_features), and the reason's name of it.
HYBRID = "full_attention_layers"


@dataclasses.dataclass(frozen=True)
class RecurrentCase(BatchShape):
    name: str
    mode: ForwardMode
    prefix: Tuple[int, ...]  # per request, the tokens its saved state has consumed
    new: Union[int, Tuple[int, ...]] = 1  # EXTEND/MIXED: per request; TARGET_VERIFY: the drafts; DECODE: 1
    kind: str = "gdn"
    heads: Tuple[int, int] = (16, 32)  # (key heads, value heads)
    head_k_dim: int = 128
    head_v_dim: int = 128
    conv_width: int = 4
    dtype: str = "bf16"
    accepted: Optional[Tuple[int, ...]] = None  # TARGET_VERIFY: per request, the drafts it keeps (1..new)
    seed: int = 0
    layer_pattern: Tuple[str, ...] = ()  # a hybrid model's layers in order, LINEAR or FULL; (): NUM_LAYERS linear
    attention_heads: Tuple[int, int] = (4, 2)  # the FULL layers' (q heads, kv heads)
    attention_head_dim: int = 32

    def __post_init__(self):
        problem = self._problem()
        if problem:
            raise ValueError(f"{self.kind} case {self.name!r}: {problem}")

    def _problem(self) -> Optional[str]:
        if not isinstance(self.name, str) or not self.name or "-" in self.name or " " in self.name:
            return "use letters, digits and _ in the name (test ids split on '-')"
        if self.kind not in KINDS:
            return f"kind {self.kind!r} not in {list(KINDS)}"
        if self.mode not in MODES:
            return f"mode {self.mode!r} not one of {[m.value for m in MODES]}"
        if self.dtype not in DTYPES:
            return f"dtype {self.dtype!r} not in {list(DTYPES)}"
        if not self.prefix or not all(isinstance(p, int) and p >= 0 for p in self.prefix):
            return f"bad prefix lengths {self.prefix!r}: one int >= 0 per request"
        hk, hv = self.heads
        if hk < 1 or hv % hk:
            return f"heads {self.heads!r} must be (key heads, value heads) with key heads dividing value heads"
        if self.conv_width < 2:
            return f"conv_width {self.conv_width} must be >= 2 (the window keeps conv_width - 1 rows)"
        lens = self.new_lens
        if len(lens) != self.bs or not all(n >= 1 for n in lens):
            return f"new {self.new!r}: one length >= 1 per request"
        if self.mode == ForwardMode.DECODE and set(lens) != {1}:
            return "DECODE takes one new token a request (new=1)"
        if self.mode == ForwardMode.MIXED and (lens[-1] != 1 or lens[0] == 1):
            return "MIXED: extend rows first (the first longer than 1), decode rows (1) last"
        if self.mode == ForwardMode.TARGET_VERIFY:
            if not isinstance(self.new, int) or self.new < 2:
                return "TARGET_VERIFY: new is the draft count, an int >= 2"
            if (self.accepted is None or len(self.accepted) != self.bs
                    or not all(1 <= n <= self.new for n in self.accepted)):
                return f"TARGET_VERIFY: accepted {self.accepted!r} must give each request 1..{self.new} drafts kept"
        elif self.accepted is not None:
            return "accepted is TARGET_VERIFY's"
        return self._pattern_problem()

    def _pattern_problem(self) -> Optional[str]:
        if not self.layer_pattern:
            return None
        if not set(self.layer_pattern) <= {LINEAR, FULL} or LINEAR not in self.layer_pattern:
            return f"layer_pattern {self.layer_pattern!r}: {LINEAR!r} or {FULL!r} per layer, one {LINEAR!r} at least"
        if len(self.full_layers) != NUM_LAYERS:
            return (f"layer_pattern {self.layer_pattern!r}: the KV pool holds {NUM_LAYERS} {FULL!r} layers, "
                    f"not {len(self.full_layers)}")
        q, kv = self.attention_heads
        if kv < 1 or q % kv:
            return f"attention_heads {self.attention_heads!r} must be (q, kv) with kv dividing q"
        return None

    @property
    def linear_layers(self) -> Tuple[int, ...]:
        """The layer ids of the linear layers, in order (the state pools' layers, by position)."""
        return tuple(i for i, kind in enumerate(self.layer_pattern or (LINEAR,) * NUM_LAYERS) if kind == LINEAR)

    @property
    def full_layers(self) -> Tuple[int, ...]:
        """The layer ids of the full-attention layers, in order (the KV pool's layers, by position)."""
        return tuple(i for i, kind in enumerate(self.layer_pattern) if kind == FULL)

    @property
    def spec(self):
        return KINDS[self.kind]

    # What the matrix asks of every case (kit.harness.scope, kit.shard): a recurrent layer reads no
    # KV cache and has no softmax layer features; a MIXED case's decode rows verify no drafts.
    kv_dtype = None
    steps = None

    @property
    def features(self) -> Tuple[str, ...]:
        return (HYBRID,) if self.layer_pattern else ()

    @property
    def kernel_variant(self) -> str:
        """What selects a compiled kernel: the kind, dtype, widths and head ratio (kit.plugin.grouping);
        a hybrid's full layers' heads too."""
        hk, hv = self.heads
        variant = f"{self.kind}-{self.dtype}-k{self.head_k_dim}-v{self.head_v_dim}-g{hv // hk}-w{self.conv_width}"
        if self.layer_pattern:
            q, kv = self.attention_heads
            variant += f"-full-g{q // kv}-d{self.attention_head_dim}"
        return variant

    @property
    def size(self) -> int:
        """How much state its batch updates (tokens x value heads x head_v_dim), as Case.size orders
        softmax cases: smallest first where any will do."""
        return (sum(self.prefix) + sum(self.new_lens)) * self.heads[1] * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        hk, hv = self.heads
        return 2 * hk * self.head_k_dim + hv * self.head_v_dim

    def after_verify(self) -> "RecurrentCase":
        """A TARGET_VERIFY's next step: a DECODE of its requests, each past the drafts it keeps."""
        return self.with_(name=self.name + "_next", mode=ForwardMode.DECODE, new=1, accepted=None,
                          prefix=tuple(p + n for p, n in zip(self.prefix, self.accepted)))

    def rng_seed(self, salt: str = "") -> int:
        return zlib.crc32(f"{self.kind}/{self.mode.value}/{self.name}/{self.seed}/{salt}".encode())

    def with_(self, **changes) -> "RecurrentCase":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, eq=False)
class RecurrentLayer:
    """The layer handed to forward(), with the fields the engines' layers carry (SGLang's
    RadixLinearAttention: conv_weights, bias, activation, A_log, dt_bias, the head counts and dims;
    Mamba2's D). Tensors: conv_weights [conv_dim, conv_width] in the case's dtype; A_log, dt_bias,
    D [Hv] float32."""

    kind: str
    layer_id: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_weights: object
    A_log: object
    dt_bias: object
    D: object = None  # Mamba2's skip, y += D x (GDN: None)
    bias: object = None  # Qwen3-Next's conv1d has none
    activation: str = "silu"

    @property
    def spec(self):
        """The kind's module (kit.engine.kinds.gdn, kit.engine.kinds.mamba2)."""
        return KINDS[self.kind]

    @property
    def q_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def k_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def v_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim


def draw_case(draw, d) -> RecurrentCase:
    """A recurrent case of `d.mode` of a kind the backend takes (kit.engine.draws.Drawing), drawn as the
    softmax ones are, simplest first (the fuzzer shrinks toward it): batch sizes at and around its engine's
    graph buckets; per request a new state (prefix 0) or a saved one, lengths anywhere or at and around the
    conv window (conv_width - 1 rows) and the kernels' CHUNK; TARGET_VERIFY's accepted drafts per request;
    key heads shared by value heads or not, a state whose key and value widths differ; every dtype."""
    from hypothesis import strategies as st

    s, width = d.size, RecurrentCase.conv_width
    edges = (width - 1, CHUNK)

    def lengths(low: int, high: int):  # anywhere up to the size's bound, or at and around an edge past it
        return st.one_of(st.integers(low, high), st.sampled_from(d.around(edges, low, CHUNK + 1)))

    kind = draw(st.sampled_from([k for k in KINDS if k in d.takes.kinds]))
    bs = draw(st.one_of(st.integers(1, s.max_bs), st.sampled_from(d.around(d.batch_sizes, 1, s.max_bs))))
    fields = {}
    if d.mode == ForwardMode.MIXED:
        bs = max(bs, 2)  # one extend row and one decode row at least
        decode = draw(st.integers(1, bs - 1))
        fields["new"] = tuple(draw(st.lists(lengths(2, s.max_new), min_size=bs - decode, max_size=bs - decode))) \
            + (1,) * decode
    elif d.mode == ForwardMode.EXTEND:
        fields["new"] = tuple(draw(st.lists(lengths(1, s.max_new), min_size=bs, max_size=bs)))
    elif d.mode == ForwardMode.TARGET_VERIFY:
        fields["new"] = draw(st.integers(2, s.max_drafts))
        fields["accepted"] = tuple(draw(st.lists(st.integers(1, fields["new"]), min_size=bs, max_size=bs)))
    prefix = tuple(draw(st.lists(st.one_of(st.just(0), lengths(1, s.max_len)), min_size=bs, max_size=bs)))
    key_heads = draw(st.sampled_from(s.kv_heads))
    group = 1 if kind == "kda" else draw(st.sampled_from(s.groups))  # Kimi Linear's q, k and v heads alike
    return RecurrentCase("drawn", d.mode, prefix, kind=kind, heads=(key_heads, key_heads * group),
                         head_k_dim=draw(st.sampled_from(s.head_dims)), head_v_dim=draw(st.sampled_from(s.head_dims)),
                         dtype=draw(st.sampled_from(("fp32",) + tuple(t for t in DTYPES if t != "fp32"))),
                         seed=draw(st.integers(0, d.seeds - 1)), **fields)
