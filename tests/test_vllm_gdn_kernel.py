"""The kit's GDN reference against vLLM's own recurrent GDN kernel (its flash-linear-attention copy,
Triton, run by the interpreter without CUDA): the same outputs and the state after every token, in
the pool's [Hv, V, K] layout. The reference is written from the model's definition; this shows that
definition is the one an engine computes, in the layout it keeps."""
from __future__ import annotations

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


def _fused_recurrent(monkeypatch):
    import vllm.third_party.flash_linear_attention.ops.fused_recurrent as module

    if environment.NO_CUDA:
        # The interpreter patches triton.language's functions while a kernel runs, not a module's
        # own alias of one (fla's `exp = tl.exp`, ops/op.py): called through a jitted function, it is.
        monkeypatch.setattr(module, "exp", _exp)
    return module.fused_recurrent_gated_delta_rule


def test_reference_is_vllms_recurrent_gdn_kernel(monkeypatch):
    case = RecurrentCase("vllm_fla", ForwardMode.EXTEND, prefix=(5,), new=(6,), heads=(1, 2), head_k_dim=16,
                         head_v_dim=32, dtype="fp32")
    fx = build(case, "cpu")
    layer, x, start, ref = fx.layers[1], fx.inputs[1], fx.starts[1][0], fx.golden[1][0]
    seq = torch.cat([start.window, x.rows.t().double()], dim=1)
    mixed = F.silu(F.conv1d(seq[None], layer.conv_weights.double()[:, None, :], groups=seq.shape[0])[0].t()).float()
    q, k, v = layer.spec.split(mixed, layer)
    n, (hk, hv), dk, dv = q.shape[0], case.heads, case.head_k_dim, case.head_v_dim
    a, b = (g.float() for g in x.gates)
    g = -layer.A_log.exp() * F.softplus(a + layer.dt_bias)
    out, states = _fused_recurrent(monkeypatch)(
        q.reshape(1, n, hk, dk), k.reshape(1, n, hk, dk), v.reshape(1, n, hv, dv), g[None], torch.sigmoid(b)[None],
        scale=dk ** -0.5, initial_state=as_pooled(start.state).float().contiguous()[None],
        inplace_final_state=False, use_qk_l2norm_in_kernel=True)  # not in place: the state after every token
    torch.testing.assert_close(out[0].double(), ref.out, rtol=0, atol=1e-6)
    torch.testing.assert_close(states.double(), torch.stack([as_pooled(s) for s in ref.states]), rtol=0, atol=1e-5)
