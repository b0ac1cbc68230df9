"""Files packed as one tar split into parts of at most a given size (any copy or upload that caps a
file's size passes them), and joined back after a check of each part's size and of the whole
archive's sha256. The tar is not compressed again: the files are wheels, compressed already."""
from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path
from typing import Dict, List, Sequence


def pack(files: Sequence[Path], out: Path, archive: str, part_bytes: int) -> Dict[str, object]:
    """`files` (by name, flat) as OUT/ARCHIVE.NNN; returns the manifest entries for the parts."""
    whole = out / archive
    with tarfile.open(whole, "w") as tar:
        for path in files:
            tar.add(path, arcname=path.name)
    digest = hashlib.sha256()
    parts: List[dict] = []
    with open(whole, "rb") as f:
        for i, chunk in enumerate(iter(lambda: f.read(part_bytes), b"")):
            part = out / f"{archive}.{i:03d}"
            part.write_bytes(chunk)
            digest.update(chunk)
            parts.append({"name": part.name, "bytes": len(chunk)})
    whole.unlink()
    return {"archive": archive, "sha256": digest.hexdigest(), "parts": parts}


def unpack(bundle: Path, manifest: dict, into: Path) -> List[Path]:
    """The parts `manifest` lists, checked and joined, unpacked into `into`; the files unpacked."""
    whole = into / manifest["archive"]
    digest = hashlib.sha256()
    with open(whole, "wb") as f:
        for part in manifest["parts"]:
            path = bundle / part["name"]
            if not path.exists():
                raise SystemExit(f"{path}: missing, the manifest lists {len(manifest['parts'])} parts: copy it over")
            data = path.read_bytes()
            if len(data) != part["bytes"]:
                raise SystemExit(f"{part['name']}: {len(data)} bytes, the manifest says {part['bytes']}: copy it again")
            digest.update(data)
            f.write(data)
    if digest.hexdigest() != manifest["sha256"]:
        raise SystemExit(f"{whole.name}: the joined parts do not match the manifest's sha256: copy the bundle again")
    with tarfile.open(whole, "r") as tar:
        names = tar.getnames()
        tar.extractall(into, filter="data")
    whole.unlink()
    return [into / name for name in names]
