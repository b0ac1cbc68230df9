"""What vLLM's recurrent-layer adapters (gdn.py, mamba2.py) share: the kit's recurrent context as a
VllmConfig, the kit's RecurrentBatch rendered as vLLM's runner renders a step's
CommonAttentionMetadata, and the layers' metadata builder's build() as the runner calls it.

The rendering, and nothing more (a bug here could hide one in vLLM): a request's state blocks are
its block-table row (one block, or with speculative decoding 1 + num_speculative_tokens), seq_lens
its prefix and new tokens, is_prefilling where it has no saved state or takes more than one token
outside a verify, on the host as the runner keeps it, and False for a graph's padded (empty)
requests (gpu_model_runner.py: is_prefilling[num_reqs:] = False); a verify's
num_decode_draft_tokens and the previous step's num_accepted_tokens as the runner hands them.
The requests are handed in the order the runner reorders a step's
(reorder_batch_to_split_decodes_and_prefills: requests with a saved state and at most a decode's
tokens, then longer ones with a saved state, then new ones, each region as the kit lists them), the
layer's inputs permuted to that order and its output back to the kit's (`to_vllm_order`,
`to_kit_order`): vLLM's builders take a step's first rows as its decodes.
"""
from __future__ import annotations

import dataclasses
from importlib import import_module
from typing import List, Optional

import torch

from backends.vllm.adapter import PROFILE, pin_problem, runtime, vllm_problem
from kit.engine.kinds.recurrent import MODES
from kit.engine.numerics import ALL, PREFILL, Numerics
from kit.harness.protocol import library_version
from kit.modes import ForwardMode

NULL_BLOCK = 0  # vLLM's NULL_BLOCK_ID: its recurrent kernels skip a row whose state block is 0
CAPTURE_SIZES = (1, 2, 4, 8)  # the config's capture sizes: the recurrent harness's batch buckets


class VllmRecurrentBackend:
    """A recurrent layer of vLLM's with its metadata builder `builder_class` (module, class name); a
    subclass builds the layers (`_vllm_layer`), names them (`layer_name`) and runs them (`forward`)."""

    profile = PROFILE
    modes = MODES
    # Its Triton causal_conv1d kernels multiply half-precision taps in their dtype and write the output
    # in the model's dtype; the chunked prefill kernels round to it in their tiles (state_cast: GDN's and
    # KDA's chunk state for the q dot, Mamba2's chunked SSD).
    # A kind whose prefill l2-normalizes q and k before its kernels adds qk_cast (PREFILL).
    numerics = Numerics(conv_products=ALL, conv_cast=ALL, state_cast=PREFILL)
    padded_state_slot = NULL_BLOCK

    @staticmethod
    def request_modes(case) -> List[str]:
        """Per request, the mode whose kernels vLLM runs it in (its declared numerics'): a prefilling
        request's rows take the chunked prefill kernels in every mode, the others the decode kernels."""
        verify = case.mode == ForwardMode.TARGET_VERIFY
        rest = ForwardMode.TARGET_VERIFY if verify else ForwardMode.DECODE
        return [(ForwardMode.EXTEND if prefills(p > 0, n, verify) else rest).value
                for p, n in zip(case.prefix, case.new_lens)]
    builder_class = ("", "")
    cpu_reason = ""  # why the layer's ops do not run without CUDA

    @classmethod
    def supports(cls, case) -> Optional[str]:
        problem = vllm_problem()
        if problem:
            return problem
        if not torch.cuda.is_available():
            return cls.cpu_reason
        if case.mode == ForwardMode.TARGET_VERIFY and 0 in case.prefix:
            return ("a verify of a request with nothing cached: vLLM's runner schedules drafts only after a "
                    "request's prefill, and its speculative rows always continue a saved state")
        return cls._kind_problem(case)

    @classmethod
    def supports_graph(cls, case) -> Optional[str]:
        if 0 in case.prefix:
            return ("a step with a new request (a prefill) under a graph: vLLM captures its recurrent layers in full "
                    "graphs for uniform decode batches only (AttentionCGSupport.UNIFORM_BATCH; "
                    "build_for_cudagraph_capture: decode-only), and runs a step with a prefill without one")
        return None

    @classmethod
    def _kind_problem(cls, case) -> Optional[str]:
        """Why the layer does not take a case it could otherwise run, or None."""
        return None

    @classmethod
    def versions(cls):
        return {"vllm": library_version("vllm"), "triton": library_version("triton")}

    @classmethod
    def installed_problem(cls) -> Optional[str]:
        return pin_problem()

    @staticmethod
    def layer_name(layer) -> str:
        """The layer's name in vLLM's forward context, as its model names it."""
        raise NotImplementedError

    def __init__(self, ctx):
        rt = runtime()
        self.ctx = ctx
        self.num_spec = max(ctx.drafts - 1, 0)
        layer0 = ctx.layers[0]
        model = rt.Model(dtype=ctx.dtype, heads=layer0.num_v_heads, kv_heads=layer0.num_v_heads,
                         head_dim=layer0.head_v_dim, kv_lora_rank=0, rope_dim=0, block_size=16, cache_dtype="auto",
                         max_model_len=4096, max_num_seqs=max(ctx.max_bs, 16), num_blocks=ctx.state_pool.size,
                         num_speculative_tokens=self.num_spec, capture_sizes=CAPTURE_SIZES)
        self.vllm_config = config = rt.vllm_config(model)
        config.cache_config.mamba_ssm_cache_dtype = "float32"  # the kit's state pools are float32
        config.cache_config.mamba_block_size = model.max_model_len
        self.configure(config)
        default = torch.get_default_dtype()
        with rt.set_current_vllm_config(config):
            rt.single_rank()
            torch.set_default_dtype(ctx.dtype)  # vLLM's layers take their parameters' dtype from it
            try:
                self.layers = {layer.layer_id: self._vllm_layer(layer) for layer in ctx.layers}
            finally:
                torch.set_default_dtype(default)
            self.builder = self.metadata_builder(ctx.device)
        self.metadata = {}

    def configure(self, config) -> None:
        """What the model's own config sets in the VllmConfig (nothing here)."""

    def _vllm_layer(self, layer):
        raise NotImplementedError

    def builder_cls(self):
        """vLLM's metadata builder class of the layers (`builder_class`)."""
        module, name = self.builder_class
        return getattr(import_module(module), name)

    def metadata_builder(self, device):
        """The layers' metadata builder, as vLLM's runner builds it for `device`."""
        spec = next(iter(self.layers.values())).get_kv_cache_spec(self.vllm_config)
        return self.builder_cls()(spec, [self.layer_name(l) for l in self.ctx.layers], self.vllm_config, device)

    def init_forward_metadata(self, batch) -> None:
        rt = runtime()
        batch = self._decode_first(batch)
        common = self._common(batch)
        verify = batch.num_accepted_tokens is not None
        drafts = None
        if verify:
            # vLLM's runner: a decode row's draft count (>= 0 marks it speculative), on the host
            drafts = torch.tensor([n - 1 for n in batch.extend_seq_lens_cpu], dtype=torch.int32)
        with rt.set_current_vllm_config(self.vllm_config):
            metadata = self.builder.build(common_prefix_len=0, common_attn_metadata=common,
                                          num_accepted_tokens=batch.num_accepted_tokens if verify else None,
                                          num_decode_draft_tokens_cpu=drafts)
        self.metadata = {self.layer_name(layer): metadata for layer in self.ctx.layers}

    def _decode_first(self, batch):
        """The batch's requests in vLLM's runner's order; the token permutation to it and back are
        kept for forward() (made here: forward() may be captured in a graph)."""
        order = request_order(batch, 1 + self.num_spec)
        starts = batch.query_start_loc.tolist()
        lens = [batch.extend_seq_lens_cpu[i] for i in order]
        tokens = [t for i in order for t in range(starts[i], starts[i + 1])]
        tokens += range(len(tokens), batch.num_tokens)  # a graph's padded tokens, nobody's, stay last
        device = batch.query_start_loc.device
        self.tokens = torch.tensor(tokens, dtype=torch.int64, device=device)
        self.inverse = torch.argsort(self.tokens)
        rows = torch.tensor(order, dtype=torch.int64, device=device)
        return dataclasses.replace(
            batch, state_indices=batch.state_indices[rows], has_initial_state=batch.has_initial_state[rows],
            query_start_loc=torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32,
                                         device=device),
            extend_seq_lens_cpu=lens, seq_lens_cpu=[batch.seq_lens_cpu[i] for i in order],
            state_blocks=None if batch.state_blocks is None else batch.state_blocks[rows],
            num_accepted_tokens=None if batch.num_accepted_tokens is None else batch.num_accepted_tokens[rows])

    def to_vllm_order(self, *tensors):
        """The step's token rows as vLLM's runner orders them."""
        return tuple(t[self.tokens] for t in tensors)

    def to_kit_order(self, out: torch.Tensor) -> torch.Tensor:
        """An output of vLLM's token order in the kit's."""
        return out[self.inverse]

    def _common(self, batch):
        """vLLM's CommonAttentionMetadata of the step."""
        rt = runtime()
        device = batch.query_start_loc.device
        lens = list(batch.extend_seq_lens_cpu)
        seq_lens = list(batch.seq_lens_cpu)
        verify = batch.num_accepted_tokens is not None
        prefilling = [prefills(saved, n, verify) for saved, n in zip(batch.has_initial_state.tolist(), lens)]
        blocks = batch.state_blocks if batch.state_blocks is not None else batch.state_indices[:, None]
        qsl_cpu = batch.query_start_loc.cpu()
        return rt.CommonAttentionMetadata(
            query_start_loc=batch.query_start_loc, query_start_loc_cpu=qsl_cpu,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device), num_reqs=batch.batch_size,
            num_actual_tokens=batch.num_tokens, max_query_len=max(lens), max_seq_len=max(seq_lens),
            block_table_tensor=blocks.to(torch.int32),
            slot_mapping=torch.full((batch.num_tokens,), -1, dtype=torch.int64, device=device),
            # on the host, as vLLM's runner hands it (num_computed_tokens_cpu < num_prompt_tokens_cpu): the
            # builder combines it with the host query lengths
            is_prefilling=torch.tensor(prefilling, dtype=torch.bool),
            seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32))


def prefills(saved: bool, new: int, verify: bool) -> bool:
    """Whether vLLM's runner hands a request as prefilling (num_computed_tokens < num_prompt_tokens),
    which its recurrent builders run in the chunked prefill kernels: one with tokens and no saved
    state, or more than one token outside a verify."""
    return new > 0 and (not saved or (new > 1 and not verify))


def request_order(batch, decode_threshold: int) -> List[int]:
    """The batch's requests as vLLM's runner reorders a step (v1/attention/backends/utils.py
    reorder_batch_to_split_decodes_and_prefills): with a saved state and at most `decode_threshold`
    tokens, then with a saved state and more, then without one (new requests, and a graph's padded
    ones, which come last), each region in the kit's order."""
    saved, lens = batch.has_initial_state.tolist(), batch.extend_seq_lens_cpu

    def region(i: int) -> int:
        if not saved[i]:
            return 2
        return 0 if lens[i] <= decode_threshold else 1
    return sorted(range(batch.batch_size), key=region)
