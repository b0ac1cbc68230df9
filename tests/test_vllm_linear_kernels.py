"""The kit's GDN and KDA references against vLLM's own recurrent kernels (its flash-linear-attention
copy, Triton, run by the interpreter without CUDA): the same outputs and the state after every token,
in the pool's [Hv, V, K] layout. The reference is written from the model's definition; this shows that
definition is the one an engine computes, in the layout it keeps."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backends.vllm import environment
from kit.engine.kinds.recurrent import RecurrentCase
from kit.engine.recurrent_step import as_pooled, build
from kit.modes import ForwardMode

environment.import_triton_utils()
from vllm.triton_utils import tl, triton  # noqa: E402


@triton.jit
def _exp(x):
    return tl.exp(x)


def _fused_recurrent(monkeypatch, kind: str):
    import vllm.third_party.flash_linear_attention.ops.fused_recurrent as module
    from vllm.third_party.flash_linear_attention.ops.kda import fused_recurrent_kda

    if environment.NO_CUDA:
        # The interpreter patches triton.language's functions while a kernel runs, not a module's
        # own alias of one (fla's `exp = tl.exp`, ops/op.py): called through a jitted function, it is.
        monkeypatch.setattr(module, "exp", _exp)
    return {"gdn": module.fused_recurrent_gated_delta_rule, "kda": fused_recurrent_kda}[kind]


def _log_decay(layer, gate):
    """g as vLLM's kernels take it: per head [n, Hv] (GDN), per key channel [n, Hv, K] (KDA)."""
    if layer.kind == "gdn":
        return -layer.A_log.exp() * F.softplus(gate + layer.dt_bias)
    per_channel = (gate + layer.dt_bias).unflatten(-1, (layer.num_v_heads, layer.head_k_dim))
    return -layer.A_log.exp()[:, None] * F.softplus(per_channel)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_reference_is_vllms_recurrent_kernel(monkeypatch, kind):
    # vLLM's KDA wrapper allocates its output like k (kda.py, fused_recurrent_kda_fwd): Kimi Linear's
    # heads and head dims of q, k and v are equal, and so are this case's.
    heads, head_v_dim = ((1, 2), 32) if kind == "gdn" else ((2, 2), 16)
    case = RecurrentCase("vllm_fla", ForwardMode.EXTEND, prefix=(5,), new=(6,), kind=kind, heads=heads,
                         head_k_dim=16, head_v_dim=head_v_dim, dtype="fp32")
    fx = build(case, "cpu")
    layer, x, start, ref = fx.layers[1], fx.inputs[1], fx.starts[1][0], fx.golden[1][0]
    seq = torch.cat([start.window, x.rows.t().double()], dim=1)
    mixed = F.silu(F.conv1d(seq[None], layer.conv_weights.double()[:, None, :], groups=seq.shape[0])[0].t()).float()
    q, k, v = layer.spec.split(mixed, layer)
    n, (hk, hv), dk, dv = q.shape[0], case.heads, case.head_k_dim, case.head_v_dim
    gate, b = (g.float() for g in x.gates)
    g = _log_decay(layer, gate)
    out, states = _fused_recurrent(monkeypatch, kind)(
        q.reshape(1, n, hk, dk), k.reshape(1, n, hk, dk), v.reshape(1, n, hv, dv), g[None], torch.sigmoid(b)[None],
        scale=dk ** -0.5, initial_state=as_pooled(start.state).float().contiguous()[None],
        inplace_final_state=False, use_qk_l2norm_in_kernel=True)  # not in place: the state after every token
    torch.testing.assert_close(out[0].double(), ref.out, rtol=0, atol=1e-6)
    torch.testing.assert_close(states.double(), torch.stack([as_pooled(s) for s in ref.states]), rtol=0, atol=1e-5)
