"""python -m backends.vllm.gpu_bundle — vLLM's attention backends for an offline x86_64 CUDA
computer, in parts of at most PART_BYTES (sizes any copy or upload passes).

    python -m backends.vllm.gpu_bundle build OUT [--wheels DIR] [--python 3.12]   (where there is network)
    python -m backends.vllm.gpu_bundle install BUNDLE TARGET                       (on the machine)

`build` takes the vllm wheel and the wheels of the packages its attention import chain needs
(requirements-cpu.txt, and openai from SGLang's set: vLLM's floor) for the target's Python
(`pip download --no-deps --only-binary=:all:`, from --wheels DIR where they are there already).
Of the vllm wheel it keeps what the attention backends load: its Python files and data, its
dist-info, and the compiled extensions COMPILED (FlashAttention 3, FlashMLA, and `_C_stable_libtorch`,
which vllm/platforms/cuda.py:23 imports unconditionally: without it no vLLM backend loads on CUDA),
all built against torch's stable C ABI. It leaves out the other extensions (FA2, MoE, DeepGEMM,
...), the `vllm-rs` frontend binary and C++ headers. That tree is one tar, xz-compressed and split
into OUT/vllm-files.tar.xz.NNN; the other wheels go to OUT/wheels (each far below the limit);
OUT/MANIFEST.json lists the parts, their sizes and the whole archive's sha256.

`install` checks and joins the parts, unpacks the tree into TARGET and installs the wheels
(`pip install --no-index --no-deps`); then `export PYTHONPATH=TARGET` (the dist-info there makes
`importlib.metadata.version("vllm")` the pin, as the kit checks). The machine keeps its torch (its
CUDA build) and FlashInfer (`pip install -e .[flashinfer]`): nothing here replaces them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import List, Sequence

from backends.sglang.install import REQUIREMENTS as SHARED
from backends.vllm.adapter import PINNED
from backends.vllm.install import REQUIREMENTS

PART_BYTES = 30 << 20
ARCHIVE = "vllm-files.tar.xz"
COMPILED = ("vllm/vllm_flash_attn/_vllm_fa3_C", "vllm/_flashmla_C", "vllm/_flashmla_extension_C",
            "vllm/_C_stable_libtorch")
LEFT_OUT_SUFFIXES = (".h", ".hpp", ".cuh", ".inl", ".cu", ".cpp")
LEFT_OUT_FILES = ("vllm/vllm-rs",)
# Wheels the target has from the kit's own set-up: its CUDA torch and FlashInfer.
TARGET_HAS = ("flashinfer-python",)
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")


def kept(name: str) -> bool:
    """Whether a file of the vllm wheel goes into the bundle."""
    if name.endswith(".so"):
        return name.split(".", 1)[0] in COMPILED
    return not name.endswith(LEFT_OUT_SUFFIXES) and name not in LEFT_OUT_FILES


def pins() -> List[str]:
    """`name==version` of every wheel the bundle needs: vLLM's requirements, openai from the shared set."""
    lines = [line.strip() for line in REQUIREMENTS.read_text().splitlines() if "==" in line and line[0] != "#"]
    lines += [line.strip() for line in SHARED.read_text().splitlines() if line.startswith("openai==")]
    return [line for line in lines if line.split("==")[0] not in TARGET_HAS]


def download(pinned: Sequence[str], into: Path, python: str, cache: Path = None) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           python, "--implementation", "cp", "-d", str(into)]
    cmd += [arg for p in PLATFORMS for arg in ("--platform", p)]
    if cache:
        cmd += ["--find-links", str(cache)]
    subprocess.run(cmd + list(pinned), check=True)


def _wheel_key(name: str) -> str:
    return name.split("-")[0].lower().replace("_", "-").replace(".", "-")


def build(out: Path, wheels: Path, python: str = "3.12", part_bytes: int = PART_BYTES, fetch=download) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    fetched = out / "downloads"
    fetch(pins(), fetched, python, wheels)
    found = {_wheel_key(p.name): p for p in fetched.glob("*.whl")}
    vllm = found.pop("vllm")
    (out / "wheels").mkdir(exist_ok=True)
    for path in found.values():
        shutil.copy(path, out / "wheels")
    archive = out / ARCHIVE
    with zipfile.ZipFile(vllm) as wheel, lzma.open(archive, "wb", preset=6) as xz, \
            tarfile.open(fileobj=xz, mode="w|") as tar:
        for info in wheel.infolist():
            if info.is_dir() or not kept(info.filename):
                continue
            entry = tarfile.TarInfo(info.filename)
            entry.size, entry.mode = info.file_size, 0o755 if info.filename.endswith(".so") else 0o644
            with wheel.open(info) as f:
                tar.addfile(entry, f)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    parts = []
    with open(archive, "rb") as f:
        for i, chunk in enumerate(iter(lambda: f.read(part_bytes), b"")):
            part = out / f"{ARCHIVE}.{i:03d}"
            part.write_bytes(chunk)
            parts.append({"name": part.name, "bytes": len(chunk)})
    archive.unlink()
    shutil.rmtree(fetched)
    manifest = {"vllm": PINNED, "python": python, "archive": ARCHIVE, "sha256": digest, "parts": parts,
                "compiled": list(COMPILED),
                "wheels": [{"name": p.name, "bytes": p.stat().st_size} for p in sorted((out / "wheels").glob("*.whl"))]}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def install(bundle: Path, target: Path, pip=subprocess.run) -> None:
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    joined = hashlib.sha256()
    target.mkdir(parents=True, exist_ok=True)
    archive = target / manifest["archive"]
    with open(archive, "wb") as f:
        for part in manifest["parts"]:
            data = (bundle / part["name"]).read_bytes()
            if len(data) != part["bytes"]:
                raise SystemExit(f"{part['name']}: {len(data)} bytes, the manifest says {part['bytes']}: copy it again")
            joined.update(data)
            f.write(data)
    if joined.hexdigest() != manifest["sha256"]:
        raise SystemExit(f"{archive}: the joined parts do not match the manifest's sha256: copy the bundle again")
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(target, filter="data")
    archive.unlink()
    wheels = sorted(str(p) for p in (bundle / "wheels").glob("*.whl"))
    if wheels:
        pip([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", *wheels], check=True)
    print(f"vllm {manifest['vllm']}'s attention backends are in {target}: export PYTHONPATH={target}"
          f"${{PYTHONPATH:+:$PYTHONPATH}}, then `python -m kit list --backends`")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.vllm.gpu_bundle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="make the bundle (needs network, or the wheels in --wheels)")
    b.add_argument("out", type=Path)
    b.add_argument("--wheels", type=Path, help="a folder of wheels to take first (e.g. an earlier download)")
    b.add_argument("--python", default="3.12", help="the target's Python version (default 3.12)")
    i = sub.add_parser("install", help="install a bundle on the machine without network")
    i.add_argument("bundle", type=Path)
    i.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        manifest = build(args.out, args.wheels, args.python)
        sizes = ", ".join(f"{p['name']} {p['bytes'] / 2**20:.1f} MiB" for p in manifest["parts"])
        print(f"{args.out}: {sizes}; {len(manifest['wheels'])} wheels "
              f"({sum(w['bytes'] for w in manifest['wheels']) / 2**20:.1f} MiB) in {args.out / 'wheels'}")
    else:
        install(args.bundle, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
