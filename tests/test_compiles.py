"""Compiles counted where each library begins one (kit.harness.compiles), seconds charged where they
went (kit.spend), the count in a session's summary and a warmup's last line, and the caches carried
to another machine by `kit warmup --save/--restore` (kit.caches)."""
import os
import subprocess
import sys
import tarfile
import time

import pytest

from kit import caches, spend
from tests.test_matrix import REPO

TOY = "tests.toys.compiling:CompilingBackend"
TINY = ["--cases", "tests.toys.tiny:CATALOG", "--case-set", "smoke"]
HEAD_DIMS = 2  # the tiny catalog's (16 and its victim's 32): the toy compiles a kernel for each


def _env(tmp_path, **dirs):
    """This environment with each cache (Triton's, inductor's, FlashInfer's) in a folder of tmp_path."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / dirs.get("triton", "triton")),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / dirs.get("inductor", "inductor")),
               FLASHINFER_WORKSPACE_BASE=str(tmp_path / dirs.get("flashinfer", "flashinfer")))
    return env


def _python(script: str, env) -> str:
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_a_timer_charges_its_own_seconds_not_those_of_a_timer_inside_it():
    before = spend.snapshot()
    with spend.timed("test.outer"):
        time.sleep(0.05)
        with spend.timed("test.inner"):
            time.sleep(0.1)
            spend.moved("test.moved", 0.04)  # of the inner timer's 0.1 s
    spent = spend.since(before)["seconds"]
    assert 0.05 <= spent["test.outer"] < 0.09, spent
    assert 0.06 <= spent["test.inner"] < 0.1, spent
    assert spent["test.moved"] == 0.04


COUNT = ("from kit import spend; from kit.harness import compiles; import {imports}; compiles.watch(); "
         "before = spend.snapshot(); {work}; compiles.watch(); spent = spend.since(before); "
         "print(spent['counts'].get(spend.{what}, 0), spent['seconds'].get(spend.{what}, 0) > 0)")


def test_a_planted_triton_compile_counts_once_and_its_cache_hit_none(tmp_path):
    script = COUNT.format(imports="triton", what="TRITON",
                          work="from tests.toys.compiling import compile_for; compile_for(16); compile_for(16)")
    assert _python(script, _env(tmp_path)) == "1 True"  # the second: from the process's own cache
    assert _python(script, _env(tmp_path)) == "0 False"  # another process: from the disk cache
    assert _python(script.replace("(16)", "(32)"), _env(tmp_path)) == "1 True"  # another constexpr compiles


def test_a_planted_inductor_compile_counts_and_its_cache_hit_none(tmp_path):
    script = COUNT.format(imports="torch, torch._dynamo", what="INDUCTOR",
                          work="torch.compile(lambda x: x * 2 + 1)(torch.ones(8))")
    assert _python(script, _env(tmp_path)) == "1 True"
    assert _python(script, _env(tmp_path))[:2] == "0 "  # another process: inductor's FX-graph cache


def test_a_flashinfer_build_counts_where_ninja_wrote_the_library_and_not_where_it_was_up_to_date(tmp_path):
    """FlashInfer's build runs ninja every time (nvcc: none here): its build is planted, writing the
    library or leaving it as it is, as ninja does."""
    script = COUNT.format(
        imports="types, pathlib, flashinfer.jit.core as core",
        what="FLASHINFER",
        work=("lib = pathlib.Path({lib!r}); "
              "spec = types.SimpleNamespace(jit_library_path=lib); "
              "build = core.JitSpecNvcc.build; "
              "import flashinfer.jit.core; "
              "build(spec); build(spec)"))
    planted = ("import flashinfer.jit.core as core; "
               "core.JitSpecNvcc.build = lambda self: self.jit_library_path.exists() or self.jit_library_path.write_text('so'); ")
    lib = tmp_path / "module.so"
    assert _python(planted + script.format(lib=str(lib)), _env(tmp_path)) == "1 True"  # built once, then up to date
    assert lib.exists()
    assert _python(planted + script.format(lib=str(lib)), _env(tmp_path)) == "0 False"


def _warmup(tmp_path, *args, **dirs) -> str:
    proc = subprocess.run([sys.executable, "-m", "kit", "warmup", "--backend", TOY, *TINY, "--jobs", "1", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=_env(tmp_path, **dirs))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_a_warmup_counts_its_compiles_and_one_after_a_restore_compiles_nothing(tmp_path):
    archive = str(tmp_path / "caches.tar.gz")
    first = _warmup(tmp_path, "--save", archive)
    assert f", {HEAD_DIMS} compiles" in first.splitlines()[-2], first
    assert f"saved to {archive}: triton " in first.splitlines()[-1], first
    fresh = _warmup(tmp_path, "--restore", archive, triton="fresh")  # another machine: an empty cache
    assert fresh.splitlines()[0].startswith(f"restored triton: "), fresh
    # Its builds are the archive's, written on this device with these versions: none is run again.
    builds = sum(line.startswith("[") for line in first.splitlines())
    assert (f"restored: the archive holds {builds} of the {builds} builds for this device and these versions; "
            f"building the other 0") in fresh.splitlines(), fresh
    assert fresh.splitlines()[-1].endswith(", 0 processes, 0 compiles (every kernel came from the caches)"), fresh
    # What was restored holds every kernel: each build, run again over it, compiles nothing.
    again = _warmup(tmp_path, triton="fresh")
    assert again.splitlines()[-1].endswith(", 0 compiles (every kernel came from the caches)"), again
    assert sum(line.startswith("[") for line in again.splitlines()) == builds, again
    unrestored = _warmup(tmp_path, triton="unrestored")
    assert unrestored.splitlines()[-1].endswith(f", {HEAD_DIMS} compiles"), unrestored


def test_save_and_restore_round_trip_every_cache_and_name_a_version_that_differs(tmp_path, monkeypatch):
    written = {name: tmp_path / "here" / name for name in caches.CACHES}
    for name, folder in written.items():
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "entry.bin").write_bytes(name.encode() * 3)
    archive = str(tmp_path / "caches.tar")
    assert caches.save(archive, written) == {name: 1 for name in caches.CACHES}
    there = {name: tmp_path / "there" / name for name in caches.CACHES}
    (there["triton"]).mkdir(parents=True)
    (there["triton"] / "kept.bin").write_bytes(b"kept")  # what a cache holds already stays
    assert not any("compile again" in line for line in caches.restore(archive, there).lines)
    for name in caches.CACHES:
        assert (there[name] / "sub" / "entry.bin").read_bytes() == name.encode() * 3
    assert (there["triton"] / "kept.bin").read_bytes() == b"kept"
    monkeypatch.setattr(caches, "versions", lambda: {"triton": "0.0", "inductor": None, "flashinfer": None})
    lines = caches.restore(archive, there).lines
    assert any(line.startswith("triton: written with triton ") and "compile again" in line for line in lines), lines


def test_an_archive_holds_its_builds_only_for_the_device_and_versions_it_was_written_with(tmp_path, monkeypatch):
    archive = str(tmp_path / "caches.tar")
    folder = tmp_path / "here" / "triton"
    folder.mkdir(parents=True)
    (folder / "k.bin").write_bytes(b"k")
    caches.save(archive, {"triton": folder}, builds=["b1", "b0"], device="NVIDIA H200")
    there = {"triton": tmp_path / "there" / "triton"}
    restored = caches.restore(archive, there)
    assert (there["triton"] / "k.bin").read_bytes() == b"k"  # moved in whole where no cache was
    assert restored.held("NVIDIA H200") == {"b0", "b1"}
    assert restored.held("NVIDIA H100 80GB HBM3") == set()  # another GPU: its kernels are not these
    monkeypatch.setattr(caches, "engine_versions", lambda: {"sglang": "0.0", "vllm": None})
    assert caches.restore(archive, there).held("NVIDIA H200") == set()  # another engine picks other kernels
    monkeypatch.undo()
    monkeypatch.setattr(caches, "versions", lambda: {"triton": "0.0", "inductor": None, "flashinfer": None})
    assert caches.restore(archive, there).held("NVIDIA H200") == set()


def test_restore_takes_no_member_outside_the_caches(tmp_path):
    archive = tmp_path / "evil.tar"
    planted = tmp_path / "planted"
    planted.write_text("x")
    with tarfile.open(archive, "w") as tar:
        tar.add(planted, arcname="../outside")
    with pytest.raises(tarfile.TarError):
        caches.restore(str(archive), {"triton": tmp_path / "t"})
    assert not (tmp_path.parent / "outside").exists()


def test_a_session_says_how_many_kernels_it_compiled_and_that_a_warm_one_compiled_none(tmp_path):
    def session() -> str:
        proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "-q", "-p",
                               "no:cacheprovider", "-n", "2", "--backend", TOY, *TINY, "--mode", "decode",
                               "--exec", "eager"],
                              cwd=REPO, capture_output=True, text=True, timeout=600, env=_env(tmp_path))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return next(line for line in proc.stdout.splitlines() if line.startswith("compiles: "))
    # Each worker compiles what it runs: the count says how many (two workers may both compile one)
    cold = session()
    assert cold.startswith("compiles: ") and " (triton " in cold and "python -m kit warmup" in cold, cold
    assert HEAD_DIMS <= int(cold.split()[1]) <= 2 * HEAD_DIMS, cold
    assert session() == "compiles: 0 (every kernel the runs loaded came from the caches)"
