"""python -m backends.offline.probe [--expect NAMES] SPEC NAME=module:attr ... — run in a fresh
process: loads each named backend class and what it imports of its engine (SPEC's `load`, SPEC a
module:attr of a bundle Spec), then prints one JSON line: `modules` (every module loaded: name ->
file, None for those without one), `failed` (backend -> "Error: message" for each that did not
load) and `missing` (the modules a ModuleNotFoundError named, and those of the comma-separated
NAMES that are not there: a bundle's list of what its chain imports). Every backend is tried,
whatever the one before did, and NAMES are looked up before any loads, so one run names every
missing module at once."""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from typing import Dict, List, Sequence


def probe(spec_target: str, backends: Dict[str, str], expect: Sequence[str] = ()) -> dict:
    from kit.targets import import_target

    missing: List[str] = [name for name in expect if importlib.util.find_spec(name) is None]
    spec = import_target(spec_target)
    failed: Dict[str, str] = {}
    for name, target in backends.items():
        try:
            spec.load(import_target(target))
        except Exception as exc:  # noqa: BLE001 - any failure to load is what the probe reports
            failed[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name not in missing:
                missing.append(exc.name)
    modules = {name: getattr(module, "__file__", None) for name, module in list(sys.modules.items())}
    return {"modules": modules, "failed": failed, "missing": missing}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.offline.probe")
    parser.add_argument("spec")
    parser.add_argument("--expect", default="")
    parser.add_argument("backends", nargs="*", help="NAME=module:attr")
    args = parser.parse_args(argv)
    found = probe(args.spec, dict(pair.split("=", 1) for pair in args.backends),
                  [name for name in args.expect.split(",") if name])
    sys.stdout.write("\n" + json.dumps(found) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
