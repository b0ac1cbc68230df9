"""A run's batches as plain data (numbers and lists, no kit object): what a standalone file needs to
rebuild them with an engine's own classes. Drawn from the kit's own fixtures of the run (the batches
it runs on one backend instance, in order: kit.engine.schedule), so the file's requests, pages,
slots and masks are the run's; its inputs are drawn in the file from a seed (a maintainer reads a
seed, not a tensor dump). A speculative mode's run comes with the server's speculative config its
backend is built with (ModeRules.speculative_config). A quantized (fp8) KV cache comes with each
layer's scales and, per batch and device type, the steps of the backend's declared numerics the
batch takes (kit.engine.numerics), under which the file's reference judges it."""
from __future__ import annotations

import dataclasses
from typing import Dict

import torch

from kit.engine.case import Case
from kit.engine.fixture import Store, fixtures_for
from kit.engine.modes import rules_for
from kit.engine.schedule import batches
from kit.harness.checks import ABS_FLOOR, RATIO
from kit.engine.numerics import Numerics
from kit.modes import Exec


class NotReproducible(ValueError):
    """A run a standalone file cannot reproduce yet; the message says what and what to run instead."""


DEVICE_TYPES = ("cpu", "cuda")  # where a file may run: a declared step may be taken on one only


def scenario(case: Case, profile, exec_: Exec, origin: str, numerics: Numerics) -> Dict:
    """The batches of `case`'s run in `exec_`, as the kit hands them to an engine of `profile` whose
    backend declares `numerics`; `origin`: where the case comes from (the record, or what it was shrunk
    from)."""
    if case.kind not in ("dense", "mla"):
        raise NotReproducible(f"{case.name}: a {case.kind} case; standalone files reproduce dense and MLA attention "
                              f"only")
    fixtures = fixtures_for(batches(case, exec_, profile), torch.device("cpu"), Store(), profile)
    speculative = rules_for(case.mode).speculative_config(case)
    pool, table = fixtures[0].pools.token_to_kv_pool, fixtures[0].pools.req_to_token_pool.req_to_token
    return dict(
        case=case.name, origin=origin, mode=case.mode.value, dtype=str(case.torch_dtype).replace("torch.", ""),
        kv_dtype=str(case.kv_torch_dtype).replace("torch.", "") if case.kv_dtype else None,
        page=case.page, num_blocks=pool.num_blocks, num_slots=pool.size,
        max_model_len=table.shape[1], max_num_seqs=table.shape[0], context_len=_context_len(case, fixtures, table),
        speculative=dataclasses.asdict(speculative) if speculative else None,
        seed=case.rng_seed(), ratio=RATIO, abs_floor=ABS_FLOOR[case.torch_dtype],
        layers=[dict(heads=layer.tp_q_head_num, kv_heads=layer.tp_k_head_num, head_dim=layer.head_dim,
                     scale=layer.scaling, cap=layer.logit_cap, window=layer.sliding_window_size,
                     sinks=list(layer.sinks), k_scale=layer.k_scale, v_scale=layer.v_scale,
                     rank=layer.kv_lora_rank, rope=layer.rope_dim)
                for layer in fixtures[0].layers],
        multi_step=rules_for(case.mode).multi_step,
        batches=[dict(name=fx.case.name, mode=fx.case.mode.value, steps={
            device: list(numerics.case_steps(fx.case, device))
            for device in DEVICE_TYPES}, requests=[_request(r) for r in fx.plan.requests],
            forwards=[[_request(r) for r in step.plan.requests] for step in fx.steps] if len(fx.steps) > 1 else None)
            for fx in fixtures])


def _context_len(case: Case, fixtures, table) -> int:
    """The model's context length, as the kit's run hands it (kit.harness.protocol.BackendContext.for_case): at
    the context edge the longest committed sequence, the req_to_token rows wider by what the mode writes past it."""
    if case.context_edge:
        return max(r.seq_len for fx in fixtures for r in fx.plan.requests)
    return table.shape[1]


def _request(r) -> Dict:
    """One request as plain data; a multi-step program's forward's row names its keys' token numbers."""
    return dict(row=r.row, seq_len=r.seq_len, n_old=r.n_old, n_new=r.n_new, slots=list(r.slots), pages=list(r.pages),
                key_pos=r.key_pos, q_pos=list(r.q_pos), keys=r.keys,
                visible=["".join("1" if v else "0" for v in row) for row in r.visible.tolist()])
