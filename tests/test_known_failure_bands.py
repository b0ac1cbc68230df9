"""A banded known failure holds the records it must and no second bug: records written before records
carried margins are banded by the worst output their message shows (kit.report.known_failures.worst_margin)."""
import re
from pathlib import Path

import pytest

from kit.report import known_failures
from kit.report.record import FAIL, Record, read_results_file

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ("results/gpu-h200.json", "results/cpu.json")
LEGACY = ("eager batch 1/4 (bs=14, 14 tokens): layer 0 output wrong: max err 0.0378 <= tol 0.0386; a head's error is "
          "0.052 of its output's magnitude (RMS) > 0.0117; bad token rows [0]; layer 1 output wrong: max err 0.0332 > "
          "tol 0.0321; bad token rows [0]; kv pool ok")


def _record(message, margins=()):
    return Record(backend="b", mode="decode", exec="eager", case="c", dtype="bf16", outcome=FAIL,
                  failure_class="kernel", message=message, margins=list(margins))


def test_a_records_worst_margin_is_its_margins_else_what_its_message_shows():
    assert known_failures.worst_margin(_record(LEGACY, [0.5, 7.0])) == 7.0
    # layer 0 by the head rule (0.052 / 0.0117), over layer 1's max error (0.0332 / 0.0321)
    assert known_failures.worst_margin(_record(LEGACY)) == pytest.approx(0.052 / 0.0117)
    ok = "replay 1/4 (bs=4 in bucket 4): layer 0 output ok: max err 0.0005 <= tol 0.004; kv pool ok; k passed ..."
    assert known_failures.worst_margin(_record(ok)) == pytest.approx(0.125)
    assert known_failures.worst_margin(_record("crash in forward: boom")) is None


def _second_bug(record: Record, factor: float) -> Record:
    """The record as a second bug would leave it: every layer's error `factor` times larger (its margins,
    and the errors its message shows, for a record written before records carried margins)."""
    def scaled(match):
        return f"{match.group(1)}{float(match.group(2)) * factor:.3g}"
    message = re.sub(r"(max err |a head's error is )([\d.e+-]+)", scaled, record.message)
    return Record(**{**record.to_dict(), "message": message, "margins": [m * factor for m in record.margins]})


def _banded_failures():
    """Every failing record of the committed results files with its entry, where that entry pins a band."""
    entries = known_failures.load_or_default()
    records = [r for path in COMMITTED for r in read_results_file(ROOT / path).records if r.outcome == FAIL]
    return [(e, r) for r in records for e in [known_failures.of_record(entries, r)]
            if e is not None and (e.band or e.layer_bands)]


def test_banded_entries_hold_every_committed_failure_they_match_and_not_a_second_bug():
    matched = _banded_failures()
    # bands on both devices' records: a one-band entry and per-layer ones
    assert any(e.band for e, _ in matched) and any(e.layer_bands for e, _ in matched)
    assert {r.device.split(" (")[0] for _, r in matched} >= {"CPU", "NVIDIA H200"}
    outside = [r.test_id for e, r in matched if not known_failures.is_expected(e, r)]
    assert not outside, outside[:5]
    for entry, record in matched:
        tops = [entry.band[1]] if entry.band else [hi for _, hi in entry.layer_bands]
        # every layer past 1.5x the widest band: a second bug wherever it lands
        least = min(m for m in (record.margins or [known_failures.worst_margin(record)]) if m > 0)
        worse = _second_bug(record, 1.5 * max(tops) / least)
        assert not known_failures.is_expected(entry, worse), (record.test_id, worse.message[:200])
        assert known_failures.against(entry, worse).startswith(f"not the known failure: {entry.id}")
