"""Times decode and extend of the Triton backend against torch_native on a GPU.

    python -m benchmarks.triton_vs_torch [--json PATH]

Batches come from the kit's own fixtures (contiguous layout, bf16, 32 query /
8 KV heads, head_dim 128). Each number is forward() alone (KV write plus
attention; metadata built beforehand), median ms from triton.testing.do_bench.
"""
from __future__ import annotations

import argparse
import json

import torch
import triton.testing

from kit.engine.case import GQA_32_8, Case
from kit.engine.fixture import fixtures_for
from kit.engine.layer import Layer
from kit.modes import ForwardMode
from kit.harness.protocol import BackendContext
from kit.harness.registry import load_backend

BACKENDS = ("triton", "torch_native")
# (mode, batch size, cached tokens per request, new tokens per request)
SHAPES = [
    (ForwardMode.DECODE, 32, 1024, 1),
    (ForwardMode.DECODE, 32, 8192, 1),
    (ForwardMode.DECODE, 128, 1024, 1),
    (ForwardMode.DECODE, 128, 4096, 1),
    (ForwardMode.EXTEND, 32, 1024, 256),
    (ForwardMode.EXTEND, 32, 4096, 512),
    (ForwardMode.EXTEND, 128, 2048, 128),
]


def bench_case(mode: ForwardMode, bs: int, cached: int, new: int) -> Case:
    new_arg = 1 if mode is ForwardMode.DECODE else (new,) * bs
    return Case(f"bench_bs{bs}_ctx{cached}_new{new}", mode=mode, prefix=(cached,) * bs, new=new_arg,
                heads=GQA_32_8, head_dim=128, dtype="bf16", page=16)


def time_forward(backend_name: str, case: Case) -> float:
    backend_cls = load_backend(backend_name)
    fx = fixtures_for([case], torch.device("cuda"), None, backend_cls.profile)[0]
    fx.install()
    backend = backend_cls(BackendContext.for_case(case, fx.pools, "cuda"))
    backend.init_forward_metadata(fx.batch)
    layer = Layer.for_case(case)
    return triton.testing.do_bench(lambda: backend.forward(fx.q, fx.k_new, fx.v_new, layer, fx.batch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    rows = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"{'mode':8} {'bs':>4} {'cached':>7} {'new':>4} " + " ".join(f"{b + ' ms':>16}" for b in BACKENDS)
          + f" {'speedup':>8}")
    for mode, bs, cached, new in SHAPES:
        case = bench_case(mode, bs, cached, new)
        ms = {b: time_forward(b, case) for b in BACKENDS}
        rows.append(dict(mode=mode.value, bs=bs, cached=cached, new=new, **{f"{b}_ms": ms[b] for b in BACKENDS}))
        print(f"{mode.value:8} {bs:>4} {cached:>7} {new:>4} " + " ".join(f"{ms[b]:>16.3f}" for b in BACKENDS)
              + f" {ms['torch_native'] / ms['triton']:>7.1f}x")
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
