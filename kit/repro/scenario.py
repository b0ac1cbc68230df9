"""A run's batch as plain data (numbers and lists, no kit object): what a standalone file needs to
rebuild it with an engine's own classes. Drawn from the kit's own fixture of the case, so the
file's requests, pages, slots and masks are the run's; its inputs are drawn in the file from a
seed (a maintainer reads a seed, not a tensor dump)."""
from __future__ import annotations

from typing import Dict

import torch

from kit.engine.case import Case
from kit.engine.fixture import Store, fixtures_for
from kit.harness.checks import ABS_FLOOR, RATIO


class NotReproducible(ValueError):
    """A run a standalone file cannot reproduce yet; the message says what and what to run instead."""


def scenario(case: Case, profile) -> Dict:
    """The case's first batch, eager, as the kit hands it to an engine of `profile`."""
    if case.is_mla or case.kind != "dense":
        raise NotReproducible(f"{case.name}: a {case.kind} case; standalone files reproduce dense attention only")
    if case.kv_dtype is not None:
        raise NotReproducible(f"{case.name}: an {case.kv_dtype} KV cache; standalone files reproduce unquantized "
                              f"caches only")
    fx = fixtures_for([case], torch.device("cpu"), Store(), profile)[0]
    if len(fx.steps) > 1:
        raise NotReproducible(f"{case.name}: a program of {len(fx.steps)} steps; standalone files reproduce one")
    pool = fx.pools.token_to_kv_pool
    return dict(
        case=case.name, mode=case.mode.value, dtype=str(case.torch_dtype).replace("torch.", ""), page=case.page,
        num_blocks=pool.num_blocks, num_slots=pool.size, max_model_len=fx.plan.max_context,
        max_num_seqs=fx.plan.max_reqs, seed=case.rng_seed(), ratio=RATIO, abs_floor=ABS_FLOOR[case.torch_dtype],
        layers=[dict(heads=layer.tp_q_head_num, kv_heads=layer.tp_k_head_num, head_dim=layer.head_dim,
                     scale=layer.scaling, cap=layer.logit_cap, window=layer.sliding_window_size,
                     sinks=list(layer.sinks)) for layer in fx.layers],
        requests=[dict(row=r.row, seq_len=r.seq_len, n_old=r.n_old, n_new=r.n_new, slots=list(r.slots),
                       pages=list(r.pages), key_pos=r.key_pos, q_pos=list(r.q_pos),
                       visible=["".join("1" if v else "0" for v in row) for row in r.visible.tolist()])
                  for r in fx.plan.requests])
