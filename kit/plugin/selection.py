"""What a session runs: the options parsed into a `Selection` (config.stash[SELECTION]), and the
backend x mode x case x exec product, enumerated here only (Selection.product)."""
from __future__ import annotations

import dataclasses
import fnmatch
import functools
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from kit.engine.catalog import Catalog, load_catalog, resolve_set
from kit.harness.capabilities import Capabilities
from kit.harness.registry import UnknownBackend, backend_label, known_backends, load_backend
from kit import options
from kit.harness.run import Run
from kit.harness.scope import cases_of, narrows_to_ci
from kit.modes import EXECS, MODES, Exec, ForwardMode, parse_exec, parse_mode
from kit.report import known_failures
from kit.report.known_failures import KnownFailure
from kit.report.record import parse_run_id
from kit.shard import Shard, kernel_group, split


def _parsed(option, parse, *values, fix=""):
    """parse(*values); a bad value is a usage error, one line naming the option and the fix."""
    try:
        return parse(*values)
    except (UnknownBackend, ValueError, ImportError, AttributeError, TypeError) as exc:
        hint = f"; {fix}" if fix and not isinstance(exc, UnknownBackend) else ""  # that one lists the known
        raise pytest.UsageError(f"{option}: {exc}{hint}") from None


def _one_name_each(labels: Dict[str, str]) -> Dict[str, str]:
    """`labels` (spec -> label), a backend named twice (by its registered name and its module:attr)
    once; two backends under one name are a usage error: they would share test ids and records."""
    specs: Dict[str, List[str]] = {}
    for spec, label in labels.items():
        specs.setdefault(label, []).append(spec)
    kept = dict(labels)
    for label, same in specs.items():
        if len(same) > 1 and len({id(_parsed(f"--backend {spec}", load_backend, spec)) for spec in same}) > 1:
            raise pytest.UsageError(f"--backend {' and --backend '.join(same)}: both are named {label!r} (the "
                                    f"class's `name`); give each its own `name`: test ids and records tell "
                                    f"backends apart by it")
        for spec in same[1:]:
            del kept[spec]
    return kept


def _naming_backends(entries: List[KnownFailure], labels) -> List[KnownFailure]:
    """`entries`, each naming a registered backend or one of this session's; else a usage error (a
    misspelt backend would leave the failure it was written for uncovered, and its entry unused)."""
    names = sorted(set(known_backends()) | set(labels))
    for entry in entries:
        if not any(fnmatch.fnmatchcase(name, entry.backend) for name in names):
            raise pytest.UsageError(f"--known-failures: {entry.where}: {entry.id} names backend {entry.backend!r}, "
                                    f"which is none of {', '.join(names)}; fix its backend column (or run the "
                                    f"backend it names with --backend)")
    return entries


def is_xdist_controller(config) -> bool:
    return (config.getoption("dist", "no") != "no" and not config.getoption("collectonly")
            and not hasattr(config, "workerinput"))


def run_of(nodeid: str) -> Optional[str]:
    """The run id of a conformance test's node id (`...::test_conformance[<run id>]`, plus
    `@<group>` under `--dist loadgroup`), None for the kit's other tests."""
    if "::test_conformance[" not in nodeid:
        return None
    return nodeid.split("[", 1)[1].rsplit("]", 1)[0]


@dataclasses.dataclass
class Selection:
    """The parsed options. The catalog and the case set import torch (cases check themselves
    against their mode's rules, `auto` asks for CUDA): the xdist controller, which runs no case,
    loads them once its workers are started (CatalogLoader), not before (loaded())."""

    labels: Dict[str, str]  # backend spec -> label, in the order given
    modes: List[ForwardMode]
    execs: List[Exec]
    catalog_target: Optional[str]  # --cases
    known: List[KnownFailure]
    _load: Callable[[], Tuple[Catalog, str, Dict[str, Optional[dict]]]]
    catalog: Optional[Catalog] = None
    case_set: Optional[str] = None
    # Per spec, the backend's `ci_cases` under `--case-set auto` on CPU (a backend too slow here for
    # every smoke case names those; `--case-set smoke` runs them all), else None: every case.
    ci_cases: Dict[str, Optional[dict]] = dataclasses.field(default_factory=dict)
    shard: Optional[Shard] = None  # --shard K/N: this session runs that part of the product (runs())

    @classmethod
    def from_options(cls, config) -> "Selection":
        opt = config.getoption
        specs = options.csv(opt("--backend")) or known_backends()
        labels = {spec: _parsed(f"--backend {spec}", backend_label, spec,
                                fix=f"give a registered name ({', '.join(known_backends())}) or module:attr of a "
                                    f"backend class that imports") for spec in specs}
        labels = _one_name_each(labels)
        if opt("--case-set") != "auto":
            _parsed("--case-set", resolve_set, opt("--case-set"))
        sel = cls(labels=labels,
                  modes=_parsed("--mode", options.modes, opt("--mode")),
                  execs=_parsed("--exec", options.execs, opt("exec_")),
                  catalog_target=opt("--cases"),
                  known=_naming_backends(_parsed("--known-failures", known_failures.load_or_default,
                                                 opt("--known-failures")), labels.values()),
                  _load=functools.partial(_load_cases, opt, list(labels)),
                  shard=_parsed("--shard", Shard.parse, opt("--shard")) if opt("--shard") else None)
        return sel if is_xdist_controller(config) else sel.loaded()

    @property
    def is_loaded(self) -> bool:
        return self.catalog is not None

    def loaded(self) -> "Selection":
        """This selection with its catalog, case set and ci_cases (loaded at the first call)."""
        if not self.is_loaded:
            self.catalog, self.case_set, self.ci_cases = self._load()
        return self

    def product(self, labels: Optional[Dict[str, str]] = None, modes: Sequence[ForwardMode] = (),
                execs: Sequence[Exec] = (), every_case: bool = False) -> Iterator[Run]:
        """backend x mode x case x exec, in that order, of the selection or of the labels (spec ->
        label), modes and execs given; every_case: the case set's every case, ci_cases aside.
        A case's eager and graph runs follow each other: they share the case's batch
        (kit.engine.fixture). Backends are not interleaved case by case: a backend's stray write
        into the kit's memory (outside its pool and its own allocations, where no verdict sees it)
        would reach the batch the next backend is judged on; kit.engine.fixture's fingerprints
        rebuild a batch that changed, but cannot say which run changed it."""
        self.loaded()
        for spec, label in (labels or self.labels).items():
            ci_cases = None if every_case else self.ci_cases.get(spec)
            for mode in modes or self.modes:
                for case in cases_of(self.catalog, self.case_set, mode, ci_cases):
                    for exec_ in execs or self.execs:
                        yield Run(spec, label, case, exec_, catalog=self.catalog_target)

    def runs(self) -> Iterator[Run]:
        """The runs this session runs: the product, or, with a shard, the product's runs whose kernel
        group is in it (kit.shard.split, the groups weighed by the case set's every case, ci_cases
        aside, as `python -m kit warmup --shard` weighs them: both split alike)."""
        if self.shard is None:
            yield from self.product()
            return
        shard_of = split((group_of(run) for run in self.product(every_case=True)), self.shard.count)
        yield from (run for run in self.product() if shard_of[group_of(run)] == self.shard.index)

    def recorded_shard(self) -> Optional[Shard]:
        """The shard, saying which selection it is a part of (the product's run ids), or None."""
        return None if self.shard is None else self.shard.of_selection(run.id for run in self.product())
    def narrowed(self) -> List[str]:
        """A line per backend `--case-set auto` without CUDA gave its ci_cases alone, saying so."""
        out = []
        for spec, ci_cases in self.loaded().ci_cases.items():
            if ci_cases is not None and spec in self.labels:
                given = sum(len(cases_of(self.catalog, self.case_set, m, ci_cases)) for m in self.modes)
                whole = sum(len(self.catalog.matrix_cases(self.case_set, m)) for m in self.modes)
                out.append(f"{self.labels[spec]} ran its ci_cases only, {given} of {whole} {self.case_set} cases "
                           f"(`--case-set auto` without CUDA; `--case-set {self.case_set}` runs them all)")
        return out

    def catalog_ids(self) -> List[str]:
        """Every run the catalog has for this case set: each registered backend (and each one named
        on the command line), every mode and exec; under `--case-set auto` without CUDA, a selected
        backend's ci_cases (the default CPU run, which CI runs and results/cpu.json holds, is whole).
        A results file lacking some of them is partial."""
        labels = sorted(set(known_backends()) | set(self.labels.values()))
        return [run.id for run in self.product({label: label for label in labels}, MODES, EXECS)]

    def run_named(self, rid: str) -> Run:
        """The run of a run id (its case from the catalog)."""
        label, mode, exec_, name = parse_run_id(rid)
        spec = {lab: spec for spec, lab in self.labels.items()}.get(label, label)
        case = self.loaded().catalog.find_case(parse_mode(mode), name)
        return Run(spec, label, case, parse_exec(exec_), catalog=self.catalog_target)


def group_of(run: Run) -> str:
    """The run's kernel group (kit.shard.kernel_group)."""
    return kernel_group(run.label, run.case.mode.value, run.case.kernel_variant)


def _load_cases(opt, specs) -> Tuple[Catalog, str, Dict[str, Optional[dict]]]:
    """The catalog, the case set and, for `--case-set auto` on CPU, each backend's `ci_cases`."""
    case_set = _parsed("--case-set", resolve_set, opt("--case-set"))
    auto_smoke = narrows_to_ci(opt("--case-set"), case_set)
    catalog = _parsed(f"--cases {opt('--cases')}", load_catalog, opt("--cases"),
                      fix="give module:attr of a kit.engine.catalog.Catalog that imports")
    return catalog, case_set, {spec: _parsed(f"--backend {spec}", lambda: Capabilities.of(load_backend(spec)).ci_cases)
                               if auto_smoke else None for spec in specs}


SELECTION = pytest.StashKey[Selection]()


class CatalogLoader:
    @pytest.hookimpl(wrapper=True)
    def pytest_sessionstart(self, session):
        """The xdist controller loads its catalog once it has started its workers (in xdist's
        sessionstart, wrapped here): its torch import overlaps theirs instead of delaying them. A
        bad `--cases` is a usage error here."""
        yield
        session.config.stash[SELECTION].loaded()
