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
