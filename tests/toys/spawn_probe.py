"""A pytest plugin for tests (`-p tests.toys.spawn_probe`): writes to $KIT_SPAWN_PROBE whether
the xdist controller had loaded the case catalog (which imports torch) when it started its workers."""
import json
import os

from kit.plugin.selection import SELECTION


def pytest_xdist_setupnodes(config, specs):
    with open(os.environ["KIT_SPAWN_PROBE"], "w") as f:
        json.dump({"catalog_loaded": config.stash[SELECTION].is_loaded}, f)
