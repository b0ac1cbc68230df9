"""The manual and its pages: what they name exists, their links resolve, the README keeps the
two commands CI runs, and none of it is a diary (no commit ids in the prose)."""
import dataclasses
import importlib
import importlib.util
import re
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MATRIX_COMMAND = ("python -m pytest -n auto --dist loadgroup tests/test_conformance.py "
                  "--results-json results-local.json")
TEST_COMMAND = ("python -m pytest -n auto --results-json results-local.json && "
                "python -m matrix check --fresh results-local.json")
# A path the pages name: a top-level folder of the repo, then a file or folder (no pattern).
PATH = re.compile(r"`((?:kit|backends|cases|matrix|tests|benchmarks|results|docs|\.ci|\.github)/[\w./-]*)`")
MODULE = re.compile(r"python -m ([\w.]+)")
DOTTED = re.compile(r"`((?:kit|backends|matrix|cases)(?:\.\w+)+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
GENERATED = re.compile(r"<!-- ([\w-]+):begin\b.*?<!-- \1:end -->", re.S)
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b")


def _prose(path: Path) -> str:
    """A page without its generated blocks (`<!-- NAME:begin ... -->` to `<!-- NAME:end -->`, as
    `python -m matrix write` writes them: they name the commit of each results file)."""
    return GENERATED.sub("", path.read_text())


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _section(path: Path, title: str) -> str:
    return path.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_module_and_name_a_page_gives_exists(page):
    text = _prose(page)
    missing = [p for p in PATH.findall(text) if not (REPO / p.rstrip("/")).exists()]
    missing += [m for m in MODULE.findall(text) if importlib.util.find_spec(m) is None]
    for dotted in DOTTED.findall(text):
        parts = dotted.split(".")
        obj = importlib.import_module(parts[0])
        for cut in range(1, len(parts)):  # a module's attribute, else its submodule
            if not hasattr(obj, parts[cut]) and hasattr(obj, "__path__"):
                if importlib.util.find_spec(".".join(parts[:cut + 1])) is not None:
                    importlib.import_module(".".join(parts[:cut + 1]))
            obj = getattr(obj, parts[cut], None)
            if obj is None:
                break
        if obj is None:
            missing.append(dotted)
    assert not missing, f"{page.name} names what does not exist: {missing}"


@pytest.mark.parametrize("page", [*PAGES, REPO / "results" / "bench" / "README.md"], ids=lambda p: p.name)
def test_every_link_resolves_to_a_file_and_heading(page):
    broken = []
    for link in LINK.findall(page.read_text()):
        if "://" in link:
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(link)
        elif anchor and path.suffix == ".md":
            text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a code block's comments
            headings = [line.lstrip("#") for line in text.splitlines() if line.startswith("#")]
            if anchor not in {_slug(h) for h in headings}:
                broken.append(link)
    assert not broken, f"{page.name}: broken links {broken}"


def test_the_readme_keeps_the_two_commands_and_says_where_things_went():
    text = (REPO / "README.md").read_text()
    assert f"```bash\n{MATRIX_COMMAND}\n```" in text and f"```bash\n{TEST_COMMAND}\n```" in text
    assert TEST_COMMAND in (REPO / ".ci" / "run").read_text()
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in text, f"the README does not link {page.name}"


README_LINES = 450  # a manual, not a measurement report: the per-case matrices live on docs/matrix.md


def test_the_readme_stays_a_manual_within_its_length():
    """Generated blocks included: the pass summary is one table a device; growth goes to docs/."""
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_LINES, (f"README.md has {lines} lines, over {README_LINES}: move detail to docs/ "
                                   "and link it")


def test_the_readme_says_the_test_command_covers_the_engines_backends():
    run = _section(REPO / "README.md", "Run")
    assert run.index(TEST_COMMAND) < run.index("covers\nthe engines' own backends"), run
    readme = (REPO / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in ("sglang_triton", "sglang_torch_native", "sglang_flashinfer",
                                                   "vllm_triton_attn", "vllm_flash_attn", "vllm_triton_mla"))


# How the kit was developed is no part of the product: not the machines it was measured on as
# "hosts" of a setting, nor the means of reaching them.
DEV_TALK = re.compile(r"(?i)the (?:H100|GPU) host|device tool|device session|carried folder|CARRY_BYTES")


def test_nothing_in_the_product_speaks_of_how_it_was_developed():
    files = [p for pattern in ("kit/**/*.py", "backends/**/*.py", "matrix/**/*.py", "cases/**/*.py",
                               "benchmarks/**/*.py", "tests/**/*.py", "docs/*.md", "*.md", "results/bench/*.md",
                               "pyproject.toml", ".ci/run", ".github/workflows/*.yml") for p in REPO.glob(pattern)]
    found = [f"{p.relative_to(REPO)}:{n}" for p in files if p != Path(__file__)
             for n, line in enumerate(p.read_text().splitlines(), 1) if DEV_TALK.search(line)]
    assert not found, found


# A measurement: a figure with its unit, within two lines of the machine it was measured on.
MACHINE = re.compile(r"\b(?:H100|H200|A100|\d+-core|machine)\b")
FIGURE = re.compile(r"\b\d+(?:\.\d+)?(?: ?- ?\d+(?:\.\d+)?)? ?(?:s|ms|min|GiB|MiB)\b")
CODE = ("kit/**/*.py", "backends/**/*.py", "matrix/**/*.py", "cases/**/*.py", "scripts/*.py", "pyproject.toml", ".ci/run")


def test_code_says_why_not_what_was_measured_where():
    """Comments and docstrings say why; what a choice saved on which machine is in
    results/bench/README.md ("Why the kit schedules as it does") and the commit messages."""
    found = []
    for path in (p for pattern in CODE for p in REPO.glob(pattern)):
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            near = " ".join(lines[max(0, n - 2):n + 3])
            if MACHINE.search(line) and FIGURE.search(near):
                found.append(f"{path.relative_to(REPO)}:{n + 1}: {line.strip()}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_are_a_manual_not_a_diary(page):
    """Measurement history, with the commit of each step, lives next to the rows
    (results/bench/README.md), not in the manual."""
    commits = COMMIT.findall(_prose(page))
    assert not commits, f"{page.name} names commits {commits}: history belongs in results/bench/README.md"


def test_adding_a_backend_names_every_field_a_backend_reads():
    """The section names the Layer fields, the context, the pool readers and every batch field
    (common and per mode), says where the test-id label comes from and which backend to copy."""
    from kit.engine.batch import ForwardBatch, SpecInfo
    from kit.engine.layer import Layer
    from kit.harness.protocol import BackendContext

    section = _section(REPO / "docs" / "extending.md", "Adding a backend")
    properties = lambda cls: [n for n, v in vars(cls).items() if isinstance(v, property)]  # noqa: E731
    names = [f.name for cls in (Layer, ForwardBatch, BackendContext) for f in dataclasses.fields(cls)]
    names += properties(Layer) + properties(ForwardBatch) + properties(BackendContext)
    names += [f"spec_info.{f.name}" for f in dataclasses.fields(SpecInfo)]
    names += ["req_to_token_pool.req_to_token", "get_key_buffer(layer_id)", "get_value_buffer(layer_id)",
              "get_kv_buffer(layer_id)", "set_kv_buffer", "page_size"]
    missing = [n for n in names if f"`{n}`" not in section and f"`{n} " not in section]
    assert not missing, missing
    assert "`name`" in section and "test ids" in section and "backends/torch_native.py" in section


def test_the_contract_says_how_many_replays_a_graph_run_has():
    """Four, three for a case of one request or one in the largest bucket: as the schedule makes them."""
    from kit.engine.modes import rules_for
    from kit.engine.profile import SGLANG
    from kit.modes import ForwardMode
    from tests.helpers import small_case

    text = " ".join((REPO / "docs" / "contract.md").read_text().split())
    assert ("That is four replays, three for a case of one request (no bs-1 batch besides it) or one in the "
            "largest bucket (no larger one).") in text
    assert f"SGLang's: {', '.join(map(str, SGLANG.batch_sizes[:3]))}, ..., {SGLANG.batch_sizes[-1]}" in text
    sizes = SGLANG.batch_sizes
    for prefix, replays in (((5, 9, 3), 4), ((7,), 3), ((4,) * (sizes[-2] + 1), 3)):
        case = small_case("c", ForwardMode.DECODE, prefix)
        schedule = rules_for(case.mode).replay_schedule(case, SGLANG)
        assert len(schedule) == replays, (len(prefix), schedule)


def test_running_md_names_everything_a_kernel_variant_holds():
    """Each part the page names, changed alone, makes another variant (and so another worker group)."""
    from kit.modes import ForwardMode
    from tests.helpers import small_case

    text = " ".join((REPO / "docs" / "running.md").read_text().split())
    base = small_case("c", ForwardMode.TARGET_VERIFY, (5, 9), new=2, page=4)
    parts = {"dtype": dict(dtype="fp16"), "head_dim": dict(head_dim=32), "GQA group": dict(heads=(4, 4)),
             "page size": dict(page=1), "a window": dict(window=4), "a cap": dict(cap=5.0),
             "hybrid layers": dict(hybrid=True), "sinks": dict(sinks=True), "a tree mask": dict(topk=2),
             "MLA's rank and rope width": dict(heads=(4, 1), head_dim=24, kv_lora_rank=16, rope_dim=8, scale=0.1),
             "a quantized KV cache": dict(kv_dtype="fp8_e4m3")}
    said = text.split("`--dist loadgroup` keeps each backend's runs of one mode and kernel variant (", 1)[1]
    said = said.split(": `Case.kernel_variant`)", 1)[0]
    for part, change in parts.items():
        assert part in said, (part, said)
        assert base.with_(**change).kernel_variant != base.kernel_variant, part


def test_the_readmes_first_screen_says_what_to_run_and_how_long():
    """The set-up and the test command, on CPU and on a GPU, with how long each takes, before anything
    else; reading a failure comes before what the kit checks."""
    text = (REPO / "README.md").read_text()
    first = "\n".join(text.splitlines()[:40])
    assert "python scripts/setup.py cpu" in first and TEST_COMMAND in first and "python scripts/setup.py cuda" in first
    assert re.search(r"Without a GPU \(2 cores: about \d+ minutes to set up[^;]*; the tests: about \d+ minutes of CPU "
                     r"time \(user \+ sys\)", first), first
    assert re.search(r"about \d+ minutes of builds[^)]*on a\s+fresh \d+-core host", first) and re.search(
        r"the matrix itself: about \d+ minutes of GPU time[^)]*H[12]00", " ".join(first.split())), first
    assert "python -m matrix html --results results-local.json" in first
    assert text.index("\n## Reading a failure\n") < text.index("\n## What it checks\n")


def _modules(folder: Path):
    """The modules and packages of a folder, as the layout names them (a package with a slash)."""
    return sorted([f"{p.name}/" if p.is_dir() else p.stem for p in folder.iterdir()
                   if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()])


def test_the_readmes_layout_names_every_folder_and_each_backend_and_benchmark():
    """The layout listed three benchmarks of six and left out flashinfer_mla."""
    layout = _section(REPO / "README.md", "Layout of the repo")
    bullets = dict(re.findall(r"^- `(\w+)/` — (.*?)(?=^- |\Z)", layout, re.M | re.S))
    folders = sorted(p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
                     and not p.name.endswith(".egg-info") and any(p.rglob("*.py")) | any(p.rglob("*.md")))
    assert sorted(bullets) == folders, (sorted(bullets), folders)
    for folder in ("backends", "benchmarks", "scripts"):
        named = set(re.findall(r"`([\w/]+)`", bullets[folder]))
        missing = [m for m in _modules(REPO / folder) if m not in named and m.rstrip("/") not in named]
        assert not missing, f"the README's layout of {folder}/ leaves out {missing}"
