"""A run's batches as plain data (numbers and lists, no kit object): what a standalone file needs to
rebuild them with an engine's own classes. Drawn from the kit's own fixtures of the run (the batches
it runs on one backend instance, in order: kit.engine.schedule), so the file's requests, pages,
slots and masks are the run's; its inputs are drawn in the file from a seed (a maintainer reads a
seed, not a tensor dump)."""
from __future__ import annotations

from typing import Dict

import torch

from kit.engine.case import Case
from kit.engine.fixture import Store, fixtures_for
from kit.engine.schedule import batches
from kit.harness.checks import ABS_FLOOR, RATIO
from kit.modes import Exec


class NotReproducible(ValueError):
    """A run a standalone file cannot reproduce yet; the message says what and what to run instead."""


def scenario(case: Case, profile, exec_: Exec, origin: str) -> Dict:
    """The batches of `case`'s run in `exec_`, as the kit hands them to an engine of `profile`;
    `origin`: where the case comes from (the record, or what it was shrunk from)."""
    if case.is_mla or case.kind != "dense":
        raise NotReproducible(f"{case.name}: a {case.kind} case; standalone files reproduce dense attention only")
    if case.kv_dtype is not None:
        raise NotReproducible(f"{case.name}: an {case.kv_dtype} KV cache; standalone files reproduce unquantized "
                              f"caches only")
    fixtures = fixtures_for(batches(case, exec_, profile), torch.device("cpu"), Store(), profile)
    steps = max(len(fx.steps) for fx in fixtures)
    if steps > 1:
        raise NotReproducible(f"{case.name}: a program of {steps} steps; standalone files reproduce one")
    pool, table = fixtures[0].pools.token_to_kv_pool, fixtures[0].pools.req_to_token_pool.req_to_token
    return dict(
        case=case.name, origin=origin, mode=case.mode.value, dtype=str(case.torch_dtype).replace("torch.", ""),
        page=case.page, num_blocks=pool.num_blocks, num_slots=pool.size,
        max_model_len=table.shape[1], max_num_seqs=table.shape[0],
        seed=case.rng_seed(), ratio=RATIO, abs_floor=ABS_FLOOR[case.torch_dtype],
        layers=[dict(heads=layer.tp_q_head_num, kv_heads=layer.tp_k_head_num, head_dim=layer.head_dim,
                     scale=layer.scaling, cap=layer.logit_cap, window=layer.sliding_window_size,
                     sinks=list(layer.sinks)) for layer in fixtures[0].layers],
        batches=[dict(name=fx.case.name, mode=fx.case.mode.value, requests=[
            dict(row=r.row, seq_len=r.seq_len, n_old=r.n_old, n_new=r.n_new, slots=list(r.slots), pages=list(r.pages),
                 key_pos=r.key_pos, q_pos=list(r.q_pos),
                 visible=["".join("1" if v else "0" for v in row) for row in r.visible.tolist()])
            for r in fx.plan.requests]) for fx in fixtures])
