"""A worker's last words: after a sticky device fault (or a run stuck in native code) the process
ends, leaving the run's record where the controller's recorder (kit.plugin.recorder) finds it."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from kit.cli import DEVICE_LOST
from kit.harness.environment import to_record


def last_words_path(results_path, nodeid: str) -> Path:
    return Path(f"{results_path}.lost") / (hashlib.sha1(nodeid.encode()).hexdigest() + ".json")


def leave_record(results_path, nodeid: str, record: dict) -> None:
    lost = last_words_path(results_path, nodeid)
    lost.parent.mkdir(parents=True, exist_ok=True)
    lost.write_text(json.dumps(record))


def end_process(config, nodeid: str, result) -> None:
    """After a sticky device fault every later case here would fail and be blamed: leave the
    record of `result`, and end this process (xdist starts a fresh worker)."""
    path = config.getoption("--results-json")
    if path:
        leave_record(path, nodeid, to_record(result))
    sys.stderr.write(f"\n{nodeid}: {result.message}\nthe device is lost; ending this process "
                     f"(under -n the run goes on in a fresh worker)\n")
    sys.stderr.flush()
    os._exit(DEVICE_LOST)
