"""Move directories between machines through size-limited folders (the GPU machine returns at most 8
files of 16 MiB, 64 MiB in all, per call, and takes 64 MiB in, working tree included).

    python scripts/bundle.py pack NAME PATH [PATH ...] --spool SPOOL [--base DIR] [--chunk-mib 12]
        tar PATHs (relative to --base, default the working directory) and cut the tar into parts of at most
        --chunk-mib under SPOOL/NAME/, with NAME.manifest.json (sha256 of the whole and of every part)
    python scripts/bundle.py send --spool SPOOL --to $OUT [--max-files 8] [--max-mib 60]
        move the next parts that fit (each with a copy of its manifest) from SPOOL to --to, counting what
        --to already holds against the limits; rerun in the next call for the rest (the spool stays on
        that machine within a session)
    python scripts/bundle.py unpack SRC [SRC ...] --to DEST [--parts PARTS_DIR]
        gather parts and manifests from the SRC folders (copied into PARTS_DIR, default DEST/.parts, so
        parts staged over several calls accumulate), and extract every bundle whose parts are all there
        and check out (sha256) into DEST; prints what is still missing
    python scripts/bundle.py status SPOOL_OR_PARTS_DIR

A bundle is complete or absent: nothing is extracted from a bundle with a missing or corrupt part.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tarfile
import time
from pathlib import Path

MANIFEST = ".manifest.json"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pack(name: str, paths: list[str], spool: Path, base: Path, chunk_mib: float) -> dict:
    if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise SystemExit(f"bundle: NAME {name!r} may hold letters, digits, '.', '_' and '-' only")
    d = spool / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    tar_path = d / f"{name}.tar"
    with tarfile.open(tar_path, "w") as tar:
        for p in paths:
            src = (base / p) if not Path(p).is_absolute() else Path(p)
            if not src.exists():
                raise SystemExit(f"bundle: {str(src)!r} does not exist")
            tar.add(str(src), arcname=str(Path(p)) if not Path(p).is_absolute() else src.name)
    chunk = int(chunk_mib * 2**20)
    parts = []
    with open(tar_path, "rb") as f:
        for i in range(10_000):
            data = f.read(chunk)
            if not data:
                break
            part = d / f"{name}.part{i:03d}"
            part.write_bytes(data)
            parts.append({"file": part.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"name": name, "bytes": tar_path.stat().st_size, "sha256": sha256(tar_path), "parts": parts,
                "paths": paths, "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tar_path.unlink()
    (d / f"{name}{MANIFEST}").write_text(json.dumps(manifest, indent=2))
    print(f"bundle: {name}: {manifest['bytes'] / 2**20:.1f} MiB in {len(parts)} part(s) of <= {chunk_mib:g} MiB")
    return manifest


def send(spool: Path, to: Path, max_files: int, max_mib: float) -> int:
    """Move parts (oldest bundle first) while the file count and size (of --to, what it already holds
    included) fit; returns the parts left."""
    to.mkdir(parents=True, exist_ok=True)
    present = [f for f in to.rglob("*") if f.is_file()]
    files, size = len(present), sum(f.stat().st_size for f in present)
    start_files, start_size = files, size
    left = 0
    for mpath in sorted(spool.glob(f"*/*{MANIFEST}"), key=lambda p: p.stat().st_mtime):
        manifest = json.loads(mpath.read_text())
        pending = [p for p in manifest["parts"] if (mpath.parent / p["file"]).is_file()]
        sent_manifest = False
        for p in pending:
            need = 1 + (not sent_manifest)
            extra = mpath.stat().st_size if not sent_manifest else 0
            if files + need > max_files or size + p["bytes"] + extra > max_mib * 2**20:
                left += 1
                continue
            if not sent_manifest:
                shutil.copyfile(mpath, to / mpath.name)
                files, size, sent_manifest = files + 1, size + extra, True
            shutil.move(str(mpath.parent / p["file"]), str(to / p["file"]))
            files, size = files + 1, size + p["bytes"]
        if not any((mpath.parent / p["file"]).is_file() for p in manifest["parts"]):
            shutil.rmtree(mpath.parent)
    print(f"bundle: sent {files - start_files} file(s), {(size - start_size) / 2**20:.1f} MiB to {to}; "
          f"{left} part(s) still in {spool}")
    return left


def unpack(sources: list[Path], dest: Path, parts_dir: Path) -> list[str]:
    """Extract every complete bundle; returns the names still incomplete."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    for src in sources:
        for f in sorted(src.iterdir()) if src.is_dir() else []:
            if f.name.endswith(MANIFEST) or ".part" in f.name:
                if not (parts_dir / f.name).is_file() or sha256(parts_dir / f.name) != sha256(f):
                    shutil.copyfile(f, parts_dir / f.name)
    incomplete = []
    for mpath in sorted(parts_dir.glob(f"*{MANIFEST}")):
        manifest = json.loads(mpath.read_text())
        name = manifest["name"]
        bad = [p["file"] for p in manifest["parts"]
               if not (parts_dir / p["file"]).is_file() or sha256(parts_dir / p["file"]) != p["sha256"]]
        if bad:
            print(f"bundle: {name}: {len(bad)} of {len(manifest['parts'])} part(s) missing or corrupt: {', '.join(bad)}")
            incomplete.append(name)
            continue
        tar_path = parts_dir / f"{name}.tar"
        with open(tar_path, "wb") as out:
            for p in manifest["parts"]:
                out.write((parts_dir / p["file"]).read_bytes())
        if sha256(tar_path) != manifest["sha256"]:
            raise SystemExit(f"bundle: {name}: the assembled tar does not match its manifest's sha256")
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tar_path) as tar:
            tar.extractall(dest, filter="data")
        tar_path.unlink()
        for p in manifest["parts"]:
            (parts_dir / p["file"]).unlink()
        mpath.unlink()
        print(f"bundle: {name}: {manifest['bytes'] / 2**20:.1f} MiB extracted into {dest} ({', '.join(manifest['paths'])})")
    return incomplete


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pk = sub.add_parser("pack")
    pk.add_argument("name")
    pk.add_argument("paths", nargs="+")
    pk.add_argument("--spool", required=True)
    pk.add_argument("--base", default=".")
    pk.add_argument("--chunk-mib", type=float, default=12.0)
    sd = sub.add_parser("send")
    sd.add_argument("--spool", required=True)
    sd.add_argument("--to", required=True)
    sd.add_argument("--max-files", type=int, default=8)
    sd.add_argument("--max-mib", type=float, default=60.0)
    up = sub.add_parser("unpack")
    up.add_argument("sources", nargs="+")
    up.add_argument("--to", required=True)
    up.add_argument("--parts", default=None)
    st = sub.add_parser("status")
    st.add_argument("dir")
    args = p.parse_args()
    if args.cmd == "pack":
        pack(args.name, args.paths, Path(args.spool), Path(args.base), args.chunk_mib)
    elif args.cmd == "send":
        send(Path(args.spool), Path(args.to), args.max_files, args.max_mib)
    elif args.cmd == "unpack":
        dest = Path(args.to)
        incomplete = unpack([Path(s) for s in args.sources], dest, Path(args.parts) if args.parts else dest / ".parts")
        return 3 if incomplete else 0
    else:
        for mpath in sorted(Path(args.dir).rglob(f"*{MANIFEST}")):
            m = json.loads(mpath.read_text())
            have = sum((mpath.parent / q["file"]).is_file() for q in m["parts"])
            print(f"{m['name']}: {have}/{len(m['parts'])} parts here, {m['bytes'] / 2**20:.1f} MiB, {', '.join(m['paths'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
