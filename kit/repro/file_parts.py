"""What every engine's standalone file holds besides the engine's own calls, as text: its opening
(the scenario literal, the device), the inputs drawn from the scenario's seed, and the inline
float64 reference with the printed verdict. A renderer puts its engine's part between INPUTS and
VERDICT: its setup, and `run(batch, inputs)`, which returns per layer the engine's output
[tokens, heads, head_dim] of one batch of the run; VERDICT runs the run's batches in order, as the
kit ran them on one backend instance, and judges each."""
from __future__ import annotations

import pprint
from typing import Dict

OPENING = '''"""Standalone repro: @ENGINE@ @BACKEND@, @MODE@ @EXEC@, case @CASE@ (attention conformance kit).
Imports only torch and @ENGINE@.
@HOW@
@ORIGIN@
Each layer's output is judged against an inline float64 reference: the error against the limit,
PASS / FAIL, exit status 1 on FAIL.
Run: python THIS_FILE (CPU: Triton's interpreter; CUDA where present)."""
import json, logging, os, sys, tempfile

import torch

SCENARIO = @SCENARIO@
S, L0 = SCENARIO, SCENARIO["layers"][0]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
dtype = getattr(torch, S["dtype"])
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the engine's Triton kernels in Triton's interpreter
'''

INPUTS = '''
# Per batch, layer and request: q of its new tokens, K and V of all its tokens (cached, then new), drawn
# in float64 from the seed and rounded to the run's dtype (the reference reads the values the engine gets).
gen = torch.Generator().manual_seed(S["seed"])


def draw_inputs(reqs):
    inputs = []
    for spec in S["layers"]:
        per_req = []
        for r in reqs:
            q = torch.randn(r["n_new"], spec["heads"], spec["head_dim"], generator=gen, dtype=torch.float64)
            k, v = (torch.randn(r["n_old"] + r["n_new"], spec["kv_heads"], spec["head_dim"], generator=gen,
                                dtype=torch.float64) for _ in "kv")
            per_req.append(tuple(x.to(dtype).to(torch.float64) for x in (q, k, v)))
        inputs.append(per_req)
    return inputs


def new_tokens(reqs, per_req, which):
    """The step's new tokens of input `which` (0 q, 1 k, 2 v), request after request, as the engine takes them."""
    return torch.cat([x[which][r["n_old"]:] if which else x[0] for x, r in zip(per_req, reqs)]).to(dtype).to(DEVICE)

'''

VERDICT = '''

def reference(spec, reqs, per_req, precision):
    """Attention of every new token over its request's visible keys, computed in `precision`."""
    rows = []
    for r, (q, k, v) in zip(reqs, per_req):
        q, k, v = q.to(precision), k.to(precision), v.to(precision)
        group = spec["heads"] // spec["kv_heads"]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * spec["scale"]
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
        rows.append(torch.einsum("hqk,khd->qhd", probs, v).to(torch.float64))
    return torch.cat(rows)


failed = False
for b, batch in enumerate(S["batches"]):
    reqs = batch["requests"]
    inputs = draw_inputs(reqs)
    outs = run(batch, inputs)
    for i, (spec, out, per_req) in enumerate(zip(S["layers"], outs, inputs)):
        golden = reference(spec, reqs, per_req, torch.float64)
        # The limit: 2x the error of the same computation in the run's dtype, plus a floor (as FlashAttention's tests).
        limit = S["ratio"] * (reference(spec, reqs, per_req, dtype) - golden).abs().max().item() + S["abs_floor"]
        err = (out.double().cpu() - golden).abs().nan_to_num(nan=float("inf")).max().item()
        ok = err <= limit
        failed |= not ok
        print(f"batch {b + 1}/{len(S['batches'])} ({batch['name']}) layer {i}: max error {err:.3g} "
              f"{'<=' if ok else '>'} limit {limit:.3g}: {'PASS' if ok else 'FAIL'}")
print("FAIL" if failed else "PASS")
sys.exit(1 if failed else 0)
'''


CUDA_GRAPH = '''

def cuda_graph(program):
    """`program` captured in a CUDA graph as engines capture one: warm-up runs on a side stream, then the
    capture on it. Returns (the graph, the outputs it writes at each replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            program()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        outs = program()
    return graph, outs

'''


def assemble(scenario: Dict, engine: str, backend: str, exec_: str, how: str, engine_part: str) -> str:
    """The whole file: OPENING (filled in), INPUTS, the engine's part, VERDICT."""
    opening = OPENING
    for key, value in (("ENGINE", engine), ("BACKEND", backend), ("MODE", scenario["mode"]), ("EXEC", exec_),
                       ("CASE", scenario["case"]), ("HOW", how), ("ORIGIN", scenario["origin"]),
                       ("SCENARIO", pprint.pformat(scenario, width=120, compact=True))):
        opening = opening.replace(f"@{key}@", value)
    return opening + INPUTS + engine_part + VERDICT
