"""Toy engines for the offline bundles' tests: YAML's backend's chain loads PyYAML (`yaml`); WHEELS'
loads the toy distributions the tests make as wheels (`kit_toy_a`, `kit_toy_b`)."""
import importlib

from backends.offline.bundle import Spec


class ToyBackend:
    """Stands for a registered backend class."""


def load_yaml(cls) -> None:
    importlib.import_module("yaml")


def load_toys(cls) -> None:
    for name in ("kit_toy_a", "kit_toy_b"):
        importlib.import_module(name)


YAML = Spec(name="yaml-toy", engine="pyyaml", where="tests.toys.offline:YAML", packages=(), load=load_yaml)
WHEELS = Spec(name="toys", engine="kit-toy-a", where="tests.toys.offline:WHEELS", packages=(), load=load_toys)
BACKENDS = {"toy": "tests.toys.offline:ToyBackend"}
