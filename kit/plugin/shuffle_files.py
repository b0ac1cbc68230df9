"""`--shuffle-files SEED`: the test files run in an order shuffled by SEED (a file's tests keep
their order), to show that no test depends on what another file imported or set before it (the kit's
own tests; any suite the plugin loads in)."""
import random


def addoption(parser) -> None:
    parser.getgroup("conformance").addoption("--shuffle-files", type=int, default=None, metavar="SEED",
                     help="run the test files in an order shuffled by SEED (each file's tests in theirs)")


def file_of(item) -> str:
    return item.nodeid.split("::", 1)[0]


class ShuffleFiles:
    """The collection hook, registered by kit.plugin.pytest_plugin."""

    def pytest_collection_modifyitems(self, config, items):
        shuffle(config, items)


def shuffle(config, items) -> None:
    seed = config.getoption("shuffle_files")
    if seed is None:
        return
    files = list(dict.fromkeys(file_of(item) for item in items))
    place = {name: i for i, name in enumerate(random.Random(seed).sample(files, len(files)))}
    items.sort(key=lambda item: place[file_of(item)])  # stable: a file's tests keep their order
