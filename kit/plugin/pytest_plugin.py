"""pytest integration (the pytest11 entry point): options, one test per run of backend x mode x
exec x case with KNOWN_FAILURES.md as strict expected failures, and --results-json. Each concern
is a plugin of its own, registered here as pytest registers its own (state in config.stash):
kit.plugin.options, selection (the options parsed, the product of runs, the catalog loaded
late), parametrize (the tests and their known-failure marks), timeouts, grouping (`--dist
loadgroup`), recorder (the results file, progress lines), device_lost (a worker's last record),
worker (an xdist worker's threads, CUDA state and exit), compile_count (the session's compiles),
shuffle_files (`--shuffle-files SEED`)."""
from __future__ import annotations

import functools
import json
import os

import pytest

from kit.process import placement
from kit.harness import interpreter, timeout
from kit.harness.environment import to_record
from kit.plugin import cuda_context, parallel_spawn
from kit.plugin.compile_count import CompileCount
from kit.plugin.device_lost import end_process
from kit.plugin.grouping import Grouping
from kit.plugin import options as plugin_options
from kit.plugin.options import addoption
from kit.plugin.parametrize import Parametrize
from kit.plugin.recorder import RECORD_KEY, Recorder
from kit.plugin import shuffle_files
from kit.plugin.selection import SELECTION, CatalogLoader, Selection, is_xdist_controller
from kit.plugin.timeouts import RunTimeouts, default_timeout
from kit.plugin.worker import DeviceSetup, exit_without_teardown, split_threads

RECORDER = "conformance-recorder"

if os.environ.get("PYTEST_XDIST_WORKER"):  # an xdist worker (set before its plugins load): kit.plugin.cuda_context
    placement.place_this_worker()  # its GPU, before any CUDA call
    cuda_context.begin()


def pytest_addoption(parser):
    addoption(parser)
    shuffle_files.addoption(parser)


@pytest.fixture
def record_conformance(request):
    def record(result):
        request.node.user_properties.append((RECORD_KEY, json.dumps(to_record(result))))
        if result.device_lost:
            end_process(request.config, request.node.nodeid, result)
    recorder = request.config.pluginmanager.get_plugin(RECORDER)
    timeout.on_stuck(functools.partial(recorder.stuck, request.node.nodeid))
    yield record
    timeout.on_stuck(None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    exit_without_teardown(config)
    if is_xdist_controller(config):
        parallel_spawn.install()
    else:  # a process that runs tests: the same Triton for all of them, whichever imports triton first
        interpreter.choose()
    split_threads(config)
    default_timeout(config)
    plugin_options.check(config)
    config.stash[SELECTION] = Selection.from_options(config)
    for name, plugin in ((RECORDER, Recorder(config)), ("conformance-runs", Parametrize()),
                         ("conformance-timeouts", RunTimeouts()), ("conformance-grouping", Grouping()),
                         ("conformance-device", DeviceSetup()), ("conformance-catalog", CatalogLoader()),
                         ("conformance-compiles", CompileCount()), ("shuffle-files", shuffle_files.ShuffleFiles())):
        config.pluginmanager.register(plugin, name)
