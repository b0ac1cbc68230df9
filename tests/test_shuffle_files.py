"""`--shuffle-files SEED` (kit.plugin.shuffle_files) reorders the test files by the seed, the same for
every process given it, each file's tests in their order."""
import types

from kit.plugin import shuffle_files

NODEIDS = [f"tests/test_{f}.py::test_{t}" for f in "abcdefgh" for t in range(3)]


def _ordered(seed):
    items = [types.SimpleNamespace(nodeid=nodeid) for nodeid in NODEIDS]
    config = types.SimpleNamespace(getoption=lambda name: seed)
    shuffle_files.shuffle(config, items)
    return [item.nodeid for item in items]


def test_files_are_shuffled_by_the_seed_and_keep_their_tests_order():
    shuffled = _ordered(7)
    files = list(dict.fromkeys(nodeid.split("::")[0] for nodeid in shuffled))
    assert sorted(shuffled) == sorted(NODEIDS) and files != sorted(files)
    assert all(shuffled[i:i + 3] == sorted(shuffled[i:i + 3]) for i in range(0, len(shuffled), 3))
    assert _ordered(7) == shuffled and _ordered(8) != shuffled


def test_without_a_seed_the_order_is_the_collections():
    assert _ordered(None) == NODEIDS
