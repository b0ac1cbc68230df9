"""What vLLM's recurrent-layer adapters (gdn.py, mamba2.py) share: the kit's recurrent context as a
VllmConfig, the kit's RecurrentBatch rendered as vLLM's runner renders a step's
CommonAttentionMetadata, and the layers' metadata builder's build() as the runner calls it.

The rendering, and nothing more (a bug here could hide one in vLLM): a request's state blocks are
its block-table row (one block, or with speculative decoding 1 + num_speculative_tokens), seq_lens
its prefix and new tokens, is_prefilling where it has no saved state or takes more than one token
outside a verify, on the host as the runner keeps it, and False for a graph's padded (empty)
requests (gpu_model_runner.py: is_prefilling[num_reqs:] = False); a verify's
num_decode_draft_tokens and the previous step's num_accepted_tokens as the runner hands them.
"""
from __future__ import annotations

import functools
import tempfile
from importlib import import_module

import torch

from backends.vllm.adapter import PROFILE, _installed_version, runtime
from kit.engine.kinds.recurrent import MODES
from kit.harness.protocol import library_version

NULL_BLOCK = 0  # vLLM's NULL_BLOCK_ID: its recurrent kernels skip a row whose state block is 0
CAPTURE_SIZES = (1, 2, 4, 8)  # the config's capture sizes: the recurrent harness's batch buckets


@functools.lru_cache(maxsize=None)
def _single_rank() -> None:
    """vLLM's process groups for one rank: its parallel linear layers (the layers' conv1d and
    projections) ask for the tensor-parallel size when they are built."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        return
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"file://{tempfile.mktemp(prefix='kit-vllm-dist-')}")
    initialize_model_parallel(1, 1)


class VllmRecurrentBackend:
    """A recurrent layer of vLLM's with its metadata builder `builder_class` (module, class name); a
    subclass builds the layers (`_vllm_layer`), names them (`layer_name`) and runs them (`forward`)."""

    profile = PROFILE
    modes = MODES
    padded_state_slot = NULL_BLOCK
    builder_class = ("", "")

    @classmethod
    def versions(cls):
        return {"vllm": _installed_version(), "triton": library_version("triton")}

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
            _single_rank()
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

    def metadata_builder(self, device):
        """The layers' metadata builder, as vLLM's runner builds it for `device`."""
        module, name = self.builder_class
        spec = next(iter(self.layers.values())).get_kv_cache_spec(self.vllm_config)
        return getattr(import_module(module), name)(spec, [self.layer_name(l) for l in self.ctx.layers],
                                                    self.vllm_config, device)

    def init_forward_metadata(self, batch) -> None:
        rt = runtime()
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

    def _common(self, batch):
        """vLLM's CommonAttentionMetadata of the step."""
        rt = runtime()
        device = batch.query_start_loc.device
        lens = list(batch.extend_seq_lens_cpu)
        seq_lens = list(batch.seq_lens_cpu)
        verify = batch.num_accepted_tokens is not None
        prefilling = [n > 0 and (not saved or (n > 1 and not verify))
                      for saved, n in zip(batch.has_initial_state.tolist(), lens)]
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
