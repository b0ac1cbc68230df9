"""What every engine's standalone file holds besides the engine's own calls, as text: its opening
(the scenario literal, the device), the inputs drawn from the scenario's seed, and the inline
float64 reference with the printed verdict. A quantized (fp8) KV cache's quantization, the rounding
steps of the backend's declared numerics and, in Triton's interpreter, its cast to fp8 as a GPU rounds
it, are the kit's own functions' source (kit.engine.kv_quant, kit.engine.reference,
kit.harness.interpreter), put into the file. A renderer puts its engine's part between INPUTS and
VERDICT: its setup, and `run(batch, inputs)`, which returns per layer the engine's output
[tokens, heads, head_dim] of one batch of the run (a multi-step program's: every step's, in
order); VERDICT runs the run's batches in order, as the kit ran them on one backend instance, and
judges each forward."""
from __future__ import annotations

import inspect
import pprint
from typing import Dict

from kit.engine import kv_quant, numerics, reference
from kit.harness import interpreter

OPENING = '''"""Standalone repro: @ENGINE@ @BACKEND@, @MODE@ @EXEC@, case @CASE@ (attention conformance kit).
Imports only torch and @ENGINE@.
@HOW@
@ORIGIN@
Each layer's output is judged against an inline float64 reference: the error against the limit,
PASS / FAIL, exit status 1 on FAIL.
Run: python THIS_FILE (CPU: Triton's interpreter; CUDA where present)."""
from __future__ import annotations

import json, logging, os, sys, tempfile
from typing import Optional

import torch

SCENARIO = @SCENARIO@
S, L0 = SCENARIO, SCENARIO["layers"][0]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
dtype = getattr(torch, S["dtype"])
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the engine's Triton kernels in Triton's interpreter
# A quantized (fp8) KV cache: what it stores of x is fp8(x / scale), read back as fp8 * scale (per layer, one
# scale for K and one for V).
KV_DTYPE = getattr(torch, S["kv_dtype"]) if S["kv_dtype"] else None
'''

# Where the cache is fp8 and Triton runs in its interpreter (no CUDA), the interpreter's cast to fp8 would round
# ties up and lose a rounding's carry at an odd exponent (triton-lang/triton#8322): the engine's kernels cast q
# and p to the cache's dtype, so the cast is made as a GPU makes it, rounded to nearest even, saturating.
FP8_CAST = '''
if DEVICE == "cpu" and KV_DTYPE is not None and os.environ.get("TRITON_INTERPRET") == "1":
    import triton.language as tl
    import triton.runtime.interpreter as interp

@FP8_ROUNDED@
    interp.InterpreterBuilder.create_fp_to_fp = _fp8_rounded_to_nearest(interp.InterpreterBuilder.create_fp_to_fp, tl,
                                                                        interp.TensorHandle)
'''

INPUTS = '''
# Per batch, layer and request: q of its new tokens, K and V of all its tokens (cached, then new), drawn
# in float64 from the seed and rounded to the run's dtype (the reference reads the values the engine gets).
# MLA: K is each token's latent row (its first `rank` columns the compressed KV, the rest its rope key, one
# KV head), V the row's first `rank` columns: the latent cache holds one row a token.
gen = torch.Generator().manual_seed(S["seed"])


def draw_inputs(reqs):
    inputs = []
    for spec in S["layers"]:
        per_req = []
        for r in reqs:
            q = torch.randn(r["n_new"], spec["heads"], spec["head_dim"], generator=gen, dtype=torch.float64)
            k, v = (torch.randn(r["n_old"] + r["n_new"], spec["kv_heads"], spec["head_dim"], generator=gen,
                                dtype=torch.float64) for _ in "kv")
            if spec["rank"]:
                v = k[..., :spec["rank"]]
            per_req.append(tuple(x.to(dtype).to(torch.float64) for x in (q, k, v)))
        inputs.append(per_req)
    return inputs


def new_tokens(reqs, per_req, which):
    """The step's new tokens of input `which` (0 q, 1 k, 2 v), request after request, as the engine takes them."""
    return torch.cat([x[which][r["n_old"]:] if which else x[0] for x, r in zip(per_req, reqs)]).to(dtype).to(DEVICE)


def forwards(batch, inputs):
    """Per forward of the batch, its requests and their inputs per layer: the batch itself, or each step of a
    multi-step program, whose rows take their q and keys from their request's draws (a draft lane's column
    that an earlier step wrote is the same token when a later step reads it)."""
    if not batch["forwards"]:
        return [(batch["requests"], inputs)]
    of = {r["row"]: i for i, r in enumerate(batch["requests"])}  # a row's request in the batch
    return [(reqs, [[gathered(per_req[of[r["row"]]], batch["requests"][of[r["row"]]], r) for r in reqs]
                    for per_req in inputs]) for reqs in batch["forwards"]]


def gathered(drawn, request, row):
    """A step's row's q, k and v out of its request's draws `drawn`: its new tokens' q, its keys' k and v."""
    q, k, v = drawn
    keys = row["keys"]
    return q[[t - request["n_old"] for t in keys[len(keys) - row["n_new"]:]]], k[keys], v[keys]


changed = []  # what the engine changed of the q, k and v it was handed (a model reuses them)


def handed(step, qkv):
    """`step()`'s outputs, and in `changed` each of `qkv` (per layer: q, k, v) that it changed in place."""
    kept = [[x.clone() for x in layer] for layer in qkv]
    outs = step()
    for i, (was, now) in enumerate(zip(kept, qkv)):
        for name, before, after in zip("qkv", was, now):
            differ = (before != after) & ~(before.isnan() & after.isnan())
            if differ.any():
                changed.append(f"layer {i}: {name} passed to forward was changed in place: {int(differ.sum())} of "
                               f"{after.numel()} values differ")
    return outs

@KV_QUANT@
'''

VERDICT = '''

@REFERENCE_STEPS@

ENVELOPE = @ENVELOPE@  # declared steps that round inside the kernel's tiles: they widen the limit by their cost


def reference(spec, reqs, per_req, precision, steps=()):
    """Attention of every new token over its request's visible keys, computed in `precision`: K and V as the
    cache holds them (an fp8 cache: quantized with the layer's scales and read back), under the declared
    numerics' `steps` (the query quantized or cast to fp8 where it meets a key the cache holds, the step's new
    tokens attended as handed, the probabilities in fp8, TF32 dots)."""
    rows = []
    tf32 = _tf32 if @TF32@ in steps else (lambda x: x)
    for r, (q, k, v) in zip(reqs, per_req):
        new = (torch.arange(k.shape[0]) >= r["n_old"])[:, None, None]
        q_read = q
        if KV_DTYPE is not None:
            as_read = [as_stored(x, spec[scale], KV_DTYPE).to(torch.float64) for x, scale in ((k, "k_scale"),
                                                                                             (v, "v_scale"))]
            if @NEW_AS_HANDED@ in steps:
                as_read = [torch.where(new, x, x_read) for x, x_read in zip((k, v), as_read)]
            k, v = as_read
            if @Q_FP8@ in steps or @Q_CAST@ in steps:
                q_read = as_stored(q, spec["k_scale"] if @Q_FP8@ in steps else 1.0, KV_DTYPE).to(torch.float64)
                if @ROPE_AS_HANDED@ in steps:  # an MLA query's rope columns as handed, its latent ones quantized
                    q_read[..., spec["rank"]:] = q[..., spec["rank"]:].to(torch.float64)
        q, q_read, k, v = (tf32(x.to(precision)) for x in (q, q_read, k, v))
        group = spec["heads"] // spec["kv_heads"]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q_read, k)
        if @NEW_AS_HANDED@ in steps:  # the step's new keys meet the query as handed
            scores = torch.where(new[:, 0, 0], torch.einsum("qhd,khd->hqk", q, k), scores)
        scores = scores * spec["scale"]
        if spec["cap"] > 0:
            scores = spec["cap"] * torch.tanh(scores / spec["cap"])
        seen = torch.tensor([[c == "1" for c in row] for row in r["visible"]])
        if spec["window"] >= 0:  # a query at p sees keys p-W..p
            qp, kp = torch.tensor(r["q_pos"])[:, None], torch.tensor(r["key_pos"])[None, :]
            seen &= (kp >= qp - spec["window"]) & (kp <= qp)
        scores = scores.masked_fill(~seen, float("-inf"))
        if spec["sinks"]:  # one more logit per head in the softmax's denominator
            sink = torch.tensor(spec["sinks"], dtype=precision)[:, None, None].expand(-1, r["n_new"], 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        if @P_FP8@ in steps:
            probs = _p_fp8(probs)
        elif @P_CAST@ in steps:
            probs = _p_cast(probs, KV_DTYPE)
        elif @P_HALF@ in steps:
            probs = _p_half(probs, dtype)[0]
        rows.append(torch.einsum("hqk,khd->qhd", tf32(probs), v).to(torch.float64))
    return torch.cat(rows)


def judged(label, spec, out, reqs, per_req, steps):
    """Whether one layer's output of one forward lies within its limit; prints the line that says so."""
    exact_steps = [s for s in steps if s not in ENVELOPE]
    exact = reference(spec, reqs, per_req, torch.float64)
    golden = reference(spec, reqs, per_req, torch.float64, exact_steps)  # under the declared numerics
    envelope = (reference(spec, reqs, per_req, torch.float64, steps) - golden).abs().max().item() \
        if exact_steps != steps else 0.0
    # The limit: 2x the error of the same computation in the run's dtype (and of the declared steps that round
    # inside the kernel's tiles), plus a floor (as FlashAttention's tests).
    limit = S["ratio"] * ((reference(spec, reqs, per_req, dtype) - exact).abs().max().item() + envelope) \
        + S["abs_floor"]
    err = (out.double().cpu() - golden).abs().nan_to_num(nan=float("inf")).max().item()
    ok = err <= limit
    print(f"{label}: max error {err:.3g} {'<=' if ok else '>'} limit {limit:.3g}"
          f"{' under ' + ', '.join(steps) if steps else ''}: {'PASS' if ok else 'FAIL'}")
    return ok


failed = False
for b, batch in enumerate(S["batches"]):
    steps = batch["steps"][torch.device(DEVICE).type]
    inputs = draw_inputs(batch["requests"])
    outs = run(batch, inputs)  # per layer, every forward's outputs in order
    parts, done = forwards(batch, inputs), 0
    for f, (reqs, per_layer) in enumerate(parts):
        rows = sum(r["n_new"] for r in reqs)
        step = f", step {f + 1}/{len(parts)}" if len(parts) > 1 else ""
        for i, (spec, out, per_req) in enumerate(zip(S["layers"], outs, per_layer)):
            label = f"batch {b + 1}/{len(S['batches'])} ({batch['name']}{step}) layer {i}"
            failed |= not judged(label, spec, out[done:done + rows], reqs, per_req, steps)
        done += rows
for problem in changed:
    print(f"inputs: {problem}: FAIL")
failed |= bool(changed)
print("FAIL" if failed else "PASS")
sys.exit(1 if failed else 0)
'''


CUDA_GRAPH = '''

def cuda_graph(program):
    """`program` captured in a CUDA graph as the engine captures one: its warm-up runs on a side stream, then
    the capture on it. Returns (the graph, the outputs it writes at each replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(@CAPTURE_WARMUPS@):
            program()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        outs = program()
    return graph, outs

'''


def _source(*functions) -> str:
    return "\n\n".join(inspect.getsource(f) for f in functions)


def _indented(text: str) -> str:
    return "\n".join("    " + line if line else line for line in text.splitlines())


def _verdict() -> str:
    """VERDICT with the reference's rounding steps (kit.engine.reference) and the step names
    (kit.engine.numerics) filled in."""
    text = VERDICT.replace("@REFERENCE_STEPS@", _source(reference._tf32, reference._p_fp8, reference._p_cast,
                                                            reference._p_half))
    text = text.replace("@ENVELOPE@", repr(list(numerics.ENVELOPE_STEPS)))
    for name in ("Q_FP8", "Q_CAST", "NEW_AS_HANDED", "ROPE_AS_HANDED", "P_FP8", "P_CAST", "P_HALF", "TF32"):
        text = text.replace(f"@{name}@", repr(getattr(numerics, name)))
    return text


def cuda_graph_part(profile) -> str:
    """CUDA_GRAPH with the warm-up runs of the engine `profile` describes (kit.engine.profile)."""
    return CUDA_GRAPH.replace("@CAPTURE_WARMUPS@", str(profile.capture_warmups))


def opening(scenario: Dict, engine: str, backend: str, exec_: str, how: str) -> str:
    """OPENING filled in: what the file reproduces, how, and the scenario literal."""
    text = OPENING
    for key, value in (("ENGINE", engine), ("BACKEND", backend), ("MODE", scenario["mode"]), ("EXEC", exec_),
                       ("CASE", scenario["case"]), ("HOW", how), ("ORIGIN", scenario["origin"]),
                       ("SCENARIO", pprint.pformat(scenario, width=120, compact=True))):
        text = text.replace(f"@{key}@", value)
    return text


def assemble(scenario: Dict, engine: str, backend: str, exec_: str, how: str, engine_part: str) -> str:
    """The whole file: OPENING (filled in), the interpreter's fp8 cast where the cache is fp8, INPUTS (with the
    cache's quantization), the engine's part, VERDICT."""
    fp8_cast = FP8_CAST.replace("@FP8_ROUNDED@", _indented(_source(interpreter._fp8_rounded_to_nearest))) \
        if scenario["kv_dtype"] else ""
    inputs = INPUTS.replace("@KV_QUANT@", _source(kv_quant.is_quantized, kv_quant.quantize, kv_quant.dequantize,
                                                  kv_quant.as_stored))
    return opening(scenario, engine, backend, exec_, how) + fp8_cast + inputs + engine_part + _verdict()
