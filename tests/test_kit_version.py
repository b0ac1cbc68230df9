"""The kit version a record names is the kit's: its checkout's commit, else the installed package's
version, never the commit of a repository the kit's tree was copied into."""
import shutil
import subprocess

from kit.harness import environment
from kit.harness.environment import kit_commit


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def _repo(path):
    path.mkdir()
    _git(path, "init", "-q")
    (path / "f").write_text("x")
    _git(path, "add", "f")
    _git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return _git(path, "rev-parse", "--short=12", "HEAD")


def test_a_copy_inside_another_repository_does_not_name_its_commit(tmp_path, monkeypatch):
    monkeypatch.delenv("KIT_COMMIT", raising=False)
    outer = _repo(tmp_path / "outer")
    copy = tmp_path / "outer" / "vendored" / "kit-copy"
    shutil.copytree(environment.REPO / "kit", copy / "kit")
    version = kit_commit(copy)
    assert outer not in version
    assert version == "unknown" or version.split("@")[0][:1].isdigit(), version


def test_the_kits_own_checkout_names_its_commit(tmp_path, monkeypatch):
    monkeypatch.delenv("KIT_COMMIT", raising=False)
    commit = _repo(tmp_path / "kit")
    assert kit_commit(tmp_path / "kit") == commit


def test_kit_commit_where_set_wins(monkeypatch):
    monkeypatch.setenv("KIT_COMMIT", "feedface")
    assert kit_commit() == "feedface"
