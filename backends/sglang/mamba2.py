"""SGLang's own Mamba2 backend (Mamba2AttnBackend, sglang 0.5.23), unmodified, behind the kit's
recurrent protocol, run as NVIDIA's Nemotron-H runs it (models/nemotron_h.py _forward_mamba: inside
HybridLinearAttnBackend, `linear_attn_backend.forward(mixer=..., use_triton_causal_conv=True)`),
over the pools and batch of backends.sglang.linear.

Mamba2AttnBackend.forward takes the whole MambaMixer2: its input projection, then the conv and the
SSD (the layer's attention), then its gated RMS norm and output projection. The kit hands the
projection's [x | B | C] rows and dt, and judges the SSD's output, so the mixer is SGLang's own
class (its `forward` runs as written) whose three dense parts pass through: `in_proj` is handed
[gate | xBC | dt] and returns it, `norm` returns the SSD's output, `out_proj` returns its input.
Its conv weights, A (= -exp(A_log), as its weight loader stores it), D and dt_bias are the layer's.

Without CUDA, mamba.py binds its causal conv1d functions on CUDA, NPU and XPU only (mamba.py:43-75),
so on CPU its forward would raise NameError: there the names its CUDA branch imports are bound to
the same objects (SGLang's causal_conv1d.py itself takes its Triton kernels without CUDA).
"""
from __future__ import annotations

from importlib import import_module
from typing import Optional

import torch

from backends.sglang.linear import SGLangLinearBackend
from kit.engine.kinds.mamba2 import CHUNK_SIZE
from kit.modes import ForwardMode

MIXER = "sglang.srt.layers.attention.mamba.mamba"
MAMBA2_BACKEND = "sglang.srt.layers.attention.hybrid_linear_attn_backend"
SSU = "sglang.kernels.ops.mamba.triton_ops"
# What mamba.py's CUDA branch imports (mamba.py:42-53): name -> (module, name there).
CUDA_CONV = {
    "causal_conv1d_fn_triton": ("sglang.kernels.ops.mamba.causal_conv1d_triton", "causal_conv1d_fn"),
    "causal_conv1d_update_triton": ("sglang.kernels.ops.mamba.causal_conv1d_triton", "causal_conv1d_update"),
    "causal_conv1d_fn": ("sglang.srt.layers.attention.mamba.causal_conv1d", "causal_conv1d_fn"),
    "causal_conv1d_update": ("sglang.srt.layers.attention.mamba.causal_conv1d", "causal_conv1d_update"),
}


def bind_conv_without_cuda(mixer_module) -> None:
    """On a host where mamba.py bound no causal conv1d (no CUDA, NPU or XPU), its CUDA branch's names."""
    for name, (module, attr) in CUDA_CONV.items():
        if not hasattr(mixer_module, name):
            setattr(mixer_module, name, getattr(import_module(module), attr))


class _PassThrough(torch.nn.Module):
    """A linear layer of the mixer that hands its input on, as (output, bias) as SGLang's linears do."""

    def forward(self, x):
        return x, None


class _NoNorm(torch.nn.Module):
    """The mixer's gated RMS norm, left out: the SSD's output is what the kit judges."""

    def forward(self, x, gate):
        return x


class _Conv1d(torch.nn.Module):
    """The mixer's conv1d parameters as MambaMixer2 keeps them: weight [conv_dim, 1, width]."""

    def __init__(self, weights, bias):
        super().__init__()
        self.weight = weights[:, None, :]
        self.bias = bias


def _mixer(cls, layer):
    """SGLang's MambaMixer2 of one layer at TP 1, its dense parts passing through (see the module)."""
    mixer = cls.__new__(cls)
    torch.nn.Module.__init__(mixer)
    heads, groups = layer.num_v_heads, layer.num_k_heads
    mixer.tp_size, mixer.activation = 1, layer.activation
    mixer.num_heads, mixer.head_dim, mixer.n_groups = heads, layer.head_v_dim, groups
    mixer.ssm_state_size = layer.head_k_dim
    mixer.intermediate_size = heads * layer.head_v_dim
    mixer.groups_ssm_state_size = groups * layer.head_k_dim
    mixer.conv_dim = mixer.intermediate_size + 2 * mixer.groups_ssm_state_size
    mixer.conv1d = _Conv1d(layer.conv_weights, layer.bias)
    mixer.in_proj, mixer.out_proj, mixer.norm = _PassThrough(), _PassThrough(), _NoNorm()
    mixer.A = -torch.exp(layer.A_log.float())
    mixer.D, mixer.dt_bias = layer.D, layer.dt_bias
    return mixer


class _HfConfig:
    """What SGLang reads of a Mamba2 model's HF config (mamba_chunk_size)."""

    mamba_chunk_size = CHUNK_SIZE


class SGLangMamba2Backend(SGLangLinearBackend):
    name = "sglang_mamba2"
    attention_kinds = ("mamba2",)
    engine_modules = (MIXER, SSU)
    # On CPU its decode and verify run in Triton's interpreter (its prefill does not, see supports()): a case each.
    ci_cases = {"decode": ("mamba2_decode_bf16_long",), "target_verify": ("mamba2_verify_saved_bf16",)}

    @classmethod
    def _kind_problem(cls, case) -> Optional[str]:
        if case.mode in (ForwardMode.EXTEND, ForwardMode.MIXED) and not torch.cuda.is_available():
            return (f"{case.mode.value} on CPU: MambaMixer2's prefill (kernels/ops/mamba/triton_ops/ssd_combined.py "
                    "mamba_chunk_scan_combined) launches _state_passing_fwd's kernel (ssd_state_passing.py:235), "
                    "autotuned over several configs, whose benchmark asks Triton for a GPU driver, which its "
                    "interpreter has none of; CUDA GPUs only")
        return None

    def _linear_backend(self, runner):
        bind_conv_without_cuda(self._mixer_module())
        # What SGLang's scheduler does at start (managers/scheduler.py:989): MambaMixer2's decode
        # dispatches selective_state_update to the backend the server args name (mamba_backend).
        import_module(SSU).initialize_mamba_selective_state_update_backend(runner.server_args)
        return import_module(MAMBA2_BACKEND).Mamba2AttnBackend(runner)

    def _hf_config(self, layer):
        return _HfConfig()

    def _mixer_module(self):
        """The module of SGLang's MambaMixer2 (mamba.py)."""
        return import_module(MIXER)

    def _layer(self, layer):
        return _mixer(self._mixer_module().MambaMixer2, layer)

    def forward(self, xbc, dt, layer, batch):
        tokens = xbc.shape[0]
        gate = xbc.new_zeros((tokens, layer.num_v_heads * layer.head_v_dim))
        projected = torch.cat([gate, xbc, dt], dim=-1)  # what in_proj hands on
        out = self.impl.linear_attn_backend.forward(
            mixer=self.layers[layer.layer_id], layer_id=layer.layer_id, hidden_states=projected, output=None,
            forward_batch=self.forward_batch, use_triton_causal_conv=True)
        return out.view(tokens, layer.num_v_heads, layer.head_v_dim)
