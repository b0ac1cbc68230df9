"""Host mirrors as an engine leaves them when it does not wait for the device to make them.

A batch carries host copies of device values: seq_lens_cpu and seq_lens_sum, of seq_lens. An engine
makes them exact by waiting for the device (SGLang does for a backend that declares
needs_cpu_seq_lens, its default); for one that opts out it does not wait, and its overlap scheduler
leaves them as the previous step left them (a speculative step's accepted tokens not yet counted:
sgl-project/sglang#26753 fixed a verify path whose seq_lens_sum was one step stale), or as an upper
bound, or absent (None). A backend says which it reads without that wait (`host_mirrors`,
kit.harness.protocol); in its runs the first batch hands those as an upper bound and the last one
step stale, and the mirrors it does not read as None; the batches between hand them exact. A failing
batch is run again on a fresh instance with exact mirrors, then with each mirror alone as it was
handed: the message names the one the backend trusts (`blame`).

The extend_*_cpu fields are the scheduler's own lengths (exact in every path it fills them): they
stay exact."""
from __future__ import annotations

import dataclasses
from typing import FrozenSet, List, Optional, Sequence

MIRRORS = ("seq_lens_cpu", "seq_lens_sum")


@dataclasses.dataclass(frozen=True)
class Regime:
    name: str  # what a mirror the backend reads holds, as messages say it
    shift: int  # each request's length moves by this many times the step's new tokens of it


UPPER = Regime("as an upper bound (each request's length plus its new tokens)", 1)
STALE = Regime("one step stale (each request's length less its new tokens)", -1)


def regime(i: int, batches: int, declared: Optional[FrozenSet[str]]) -> Optional[Regime]:
    """How batch i of a run's `batches` hands its host mirrors: None (exact) for a backend that needs
    them exact (declares none); else an upper bound in the first, one step stale in the last."""
    if declared is None:
        return None
    return STALE if i == batches - 1 else UPPER if i == 0 else None


def handed(batch, new: Sequence[int], regime: Optional[Regime], declared: Optional[FrozenSet[str]],
           only: Optional[str] = None):
    """`batch` with its host mirrors as `regime` leaves them: those in `declared` moved by each row's
    `new` tokens (rows past them by one), the others None; with `only`, that mirror alone so and the
    others exact."""
    import torch  # here: the capabilities read MIRRORS where torch is not imported

    if regime is None:
        return batch
    rows = batch.seq_lens_cpu.shape[0]
    moves = torch.tensor(list(new)[:rows] + [1] * (rows - len(new)), dtype=batch.seq_lens_cpu.dtype)
    lens = (batch.seq_lens_cpu + regime.shift * moves).clamp(min=0)
    values = dict(seq_lens_cpu=lens, seq_lens_sum=int(lens[:batch.batch_size].sum()))
    return dataclasses.replace(batch, **{m: values[m] if m in declared else None for m in MIRRORS
                                         if only is None or m == only})


def describe(mirror: str, regime: Regime, declared: FrozenSet[str]) -> str:
    return f"{mirror} handed {regime.name}" if mirror in declared else f"{mirror} handed None (not in host_mirrors)"


def blame(wrong_with, regime: Regime, declared: FrozenSet[str]) -> str:
    """What the batch tells of the mirrors, run again on fresh instances (`wrong_with(only)`: whether
    it fails with the mirror `only` as handed and the others exact; None: all exact): '' where it
    fails with exact mirrors too, or with no mirror alone as handed (the mirrors are not to blame)."""
    if wrong_with(None):
        return ""
    trusted: List[str] = [describe(m, regime, declared) for m in MIRRORS if wrong_with(m)]
    if not trusted:
        return ""
    return (f"; on a fresh instance with exact host mirrors the batch is right, and wrong with "
            f"{' or '.join(trusted)} alone: the backend trusts a host mirror the engine does not wait for "
            f"(declare only those it reads, or none to have the engine make them exact)")
