"""An engine adapter of a toy engine, `toy_engine`, pinned at 1.0 as distribution `toy-engine`: the
test plants it (or not) in a folder on sys.path, importing or broken."""
import importlib

from backends import pinned
from tests.toys.dense import DenseGraphBackend


class ToyEngineBackend(DenseGraphBackend):
    name = "toy_engine"

    @classmethod
    def installed_problem(cls):
        return pinned.pin_problem("toy-engine", "1.0", "pip install toy-engine")

    @classmethod
    def load_engine(cls):
        importlib.import_module("toy_engine")
