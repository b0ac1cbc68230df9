"""The kit's own tests: `--shuffle-files SEED` runs their files in an order shuffled by SEED (a
file's tests keep their order), to show that no test depends on what another file imported or set
before it."""
import random


def pytest_addoption(parser):
    parser.addoption("--shuffle-files", type=int, default=None, metavar="SEED",
                     help="run the test files in an order shuffled by SEED (each file's tests in theirs)")


def file_of(item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("shuffle_files")
    if seed is None:
        return
    files = list(dict.fromkeys(file_of(item) for item in items))
    place = {name: i for i, name in enumerate(random.Random(seed).sample(files, len(files)))}
    items.sort(key=lambda item: place[file_of(item)])  # stable: a file's tests keep their order
