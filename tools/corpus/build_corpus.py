#!/usr/bin/env python3
"""Build the English training corpus for the specula byte-level model pair.

Runs on the CPU machine (Debian bookworm, `main` only). It fetches a fixed list
of text-carrying Debian packages with `apt-get download`, unpacks them with
`dpkg-deb -x` into a cache folder (nothing is installed), extracts English
plain text, deduplicates it, and writes a fixed train/validation split:

    .corpus/train.bin.xz   documents joined by NUL bytes (xz-compressed, so
    .corpus/val.bin.xz     that the corpus fits the device's carry limit)
    .corpus/manifest.json  package versions, per-source byte counts, sha256s

Sources and why (doc-rfc is non-free and the image only enables `main`;
Debian ships no Project Gutenberg package; bible-kjv-text stores the text in
its own compressed format, and its Early Modern English would skew a small
model):
  * fortunes, fortunes-min, fortune-anarchism, fortunes-bofh-excuses,
    fortunes-debian-hints: quotations, jokes, poems, short conversational
    English, one document per cookie.
  * jargon-text: the Jargon File, explanatory prose about hacker culture.
  * miscfiles: the US Declaration of Independence and Constitution.
  * doc-debian, debian-reference-en: Debian's constitution, social contract,
    bug-reporting guides and the Debian Reference (tutorial prose).
  * python3.11-doc: the reStructuredText sources of the Python tutorial,
    library and language reference.
  * perl-doc: the perl*.pod manual pages (tutorials, FAQs, reference).
  * linux-doc-6.1: the kernel's Documentation/ tree (.rst/.txt), English
    only (translations/ is skipped).

Determinism: files are read in sorted order, deduplication keeps the first
occurrence, and a document's split is a function of its own content hash,
so the same package versions always give byte-identical output.
"""

import argparse
import gzip
import hashlib
import json
import lzma
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

# (package, version this corpus was built from). The version is asked for
# first; if the archive has moved on, the current candidate is used and the
# manifest records what was actually read.
PACKAGES = [
    ("fortunes", "1:1.99.1-7.3"),
    ("fortunes-min", "1:1.99.1-7.3"),
    ("fortune-anarchism", "1.8.0-1"),
    ("fortunes-bofh-excuses", "1.2-3"),
    ("fortunes-debian-hints", "2.01.4"),
    ("jargon-text", "4.4.7-4.1"),
    ("miscfiles", "1.5+dfsg-4"),
    ("doc-debian", "11.3+nmu1"),
    ("debian-reference-en", "2.100"),
    ("python3.11-doc", "3.11.2-6+deb12u9"),
    ("perl-doc", "5.36.0-7+deb12u4"),
    ("linux-doc-6.1", "6.1.192-2"),
]

VAL_PER_MILLE = 20          # about 2% of documents go to validation
CHUNK_BYTES = 8192          # long files are cut into pieces of about this size
MIN_DOC_BYTES = 16          # shorter documents carry no useful context
MAX_NON_ASCII = 0.05        # drop documents that are mostly not English/ASCII
PARA_DEDUP_MIN = 120        # repeated paragraphs at least this long are dropped


# ---------------------------------------------------------------- fetching

def fetch(cache: Path) -> dict:
    """Download and unpack every package; return {package: version read}."""
    cache.mkdir(parents=True, exist_ok=True)
    versions = {}
    for name, version in PACKAGES:
        root = cache / name
        stamp = root / ".version"
        if stamp.exists():
            versions[name] = stamp.read_text().strip()
            continue
        debs = cache / "debs"
        debs.mkdir(exist_ok=True)
        got = _download(debs, f"{name}={version}") or _download(debs, name)
        if not got:
            sys.exit(f"could not download {name}; run apt-get update first")
        root.mkdir(exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(got), str(root)], check=True)
        read_version = subprocess.run(
            ["dpkg-deb", "-f", str(got), "Version"], check=True,
            capture_output=True, text=True).stdout.strip()
        if read_version != version:
            print(f"note: {name} {version} not available, used {read_version}")
        stamp.write_text(read_version + "\n")
        versions[name] = read_version
    return versions


def _download(debs: Path, spec: str):
    before = set(debs.glob("*.deb"))
    r = subprocess.run(["apt-get", "download", spec], cwd=debs,
                       capture_output=True, text=True)
    new = set(debs.glob("*.deb")) - before
    if r.returncode != 0 or not new:
        return None
    return new.pop()


# ---------------------------------------------------------------- reading

def read_text(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        # A few old fortune and kernel files are Latin-1.
        return data.decode("latin-1")


def files(root: Path, pattern: str, exclude=None):
    out = []
    for p in sorted(root.glob(pattern)):
        if not p.is_file() or p.is_symlink():
            continue
        if exclude and exclude(p):
            continue
        out.append(p)
    return out


def fortune_docs(path: Path):
    """A fortune file holds cookies separated by lines holding only '%'."""
    cookie = []
    for line in read_text(path).split("\n"):
        if line.strip() == "%":
            yield "\n".join(cookie)
            cookie = []
        else:
            cookie.append(line)
    yield "\n".join(cookie)


def sources(cache: Path):
    """Yield (source label, document text) in a fixed order."""
    def games(pkg):
        return cache / pkg / "usr/share/games/fortunes"

    # Fortunes: only the top level of the folder (language subfolders such as
    # debian-hints' de/, fr/ are not English); .dat are indexes, .u8 links.
    for pkg in ["fortunes", "fortunes-min", "fortune-anarchism",
                "fortunes-bofh-excuses", "fortunes-debian-hints"]:
        for p in files(games(pkg), "*",
                       exclude=lambda p: p.suffix in (".dat", ".u8")):
            for doc in fortune_docs(p):
                yield "fortunes", doc

    yield "jargon", read_text(
        cache / "jargon-text/usr/share/doc/jargon-text/jargon.txt.gz")

    for name in ["us-declaration.gz", "us-constitution.gz"]:
        yield "misc", read_text(cache / "miscfiles/usr/share/state" / name)

    # doc-debian keeps older versions of its texts beside the current one
    # (constitution.1.0.txt ...); only the current ones are read.
    deb = cache / "doc-debian/usr/share/doc/debian"
    for p in files(deb, "*", exclude=lambda p: re.search(r"\.\d+\.\d+\.txt", p.name)):
        yield "debian", read_text(p)
    yield "debian", read_text(cache / "debian-reference-en/usr/share/"
                              "debian-reference/debian-reference.en.txt.gz")

    py = cache / "python3.11-doc/usr/share/doc/python3.11/html/_sources"
    for p in files(py, "**/*.rst.txt"):
        yield "python-doc", read_text(p)

    for p in files(cache / "perl-doc/usr/share/perl", "*/pod/*.pod"):
        yield "perl-doc", read_text(p)

    kdoc = cache / "linux-doc-6.1/usr/share/doc/linux-doc-6.1/Documentation"
    for p in files(kdoc, "**/*.gz",
                   exclude=lambda p: "translations" in p.parts
                   or not re.search(r"\.(rst|txt)\.gz$", p.name)):
        yield "linux-doc", read_text(p)


# ---------------------------------------------------------------- cleaning

_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(text: str) -> str:
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CTRL.sub("", text)          # also guarantees no NUL (our separator)
    lines = [ln.rstrip() for ln in text.split("\n")]
    text = "\n".join(lines).strip("\n")
    return re.sub(r"\n{3,}", "\n\n", text)


def non_ascii_fraction(b: bytes) -> float:
    return sum(1 for c in b if c >= 128) / max(1, len(b))


def chunks(text: str):
    """Cut long documents at paragraph boundaries into ~CHUNK_BYTES pieces so
    that the split and the deduplication work at a finer grain than a whole
    manual."""
    if len(text.encode()) <= 2 * CHUNK_BYTES:
        yield text
        return
    cur, size = [], 0
    for para in text.split("\n\n"):
        n = len(para.encode()) + 2
        if cur and size + n > CHUNK_BYTES:
            yield "\n\n".join(cur)
            cur, size = [], 0
        cur.append(para)
        size += n
    if cur:
        yield "\n\n".join(cur)


def norm_key(text: str) -> bytes:
    return hashlib.sha256(" ".join(text.lower().split()).encode()).digest()


def build(cache: Path):
    seen_docs, seen_paras = set(), set()
    stats = {}
    train, val = [], []
    for label, raw in sources(cache):
        st = stats.setdefault(label, {"docs_in": 0, "docs": 0, "train_bytes": 0,
                                      "val_bytes": 0, "dropped_dup": 0,
                                      "dropped_other": 0})
        for piece in chunks(clean(raw)):
            st["docs_in"] += 1
            key = norm_key(piece)
            if key in seen_docs:
                st["dropped_dup"] += 1
                continue
            seen_docs.add(key)
            # Paragraph-level dedup removes boilerplate (license headers,
            # repeated warnings) that recurs across otherwise distinct files.
            kept = []
            for para in piece.split("\n\n"):
                if len(para) >= PARA_DEDUP_MIN:
                    pk = norm_key(para)
                    if pk in seen_paras:
                        continue
                    seen_paras.add(pk)
                kept.append(para)
            doc = "\n\n".join(kept).strip("\n")
            b = doc.encode("utf-8")
            if len(b) < MIN_DOC_BYTES or non_ascii_fraction(b) > MAX_NON_ASCII:
                st["dropped_other"] += 1
                continue
            st["docs"] += 1
            # The split depends only on the document's own bytes.
            h = int.from_bytes(hashlib.sha256(b).digest()[:8], "little")
            if h % 1000 < VAL_PER_MILLE:
                val.append(b)
                st["val_bytes"] += len(b)
            else:
                train.append(b)
                st["train_bytes"] += len(b)
    return train, val, stats


def write(out: Path, name: str, docs) -> dict:
    data = b"\x00".join(docs)
    path = out / f"{name}.bin.xz"
    path.write_bytes(lzma.compress(data, preset=6))
    return {"file": path.name, "docs": len(docs), "bytes": len(data),
            "sha256_uncompressed": hashlib.sha256(data).hexdigest()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".corpus", help="output folder (git-ignored)")
    ap.add_argument("--cache", default="/tmp/specula-corpus-debs",
                    help="where the .deb files are downloaded and unpacked")
    args = ap.parse_args()
    out, cache = Path(args.out), Path(args.cache)
    out.mkdir(parents=True, exist_ok=True)

    versions = fetch(cache)
    train, val, stats = build(cache)
    manifest = {
        "format": "documents (UTF-8) joined by a single NUL byte, xz-compressed",
        "packages": versions,
        "val_per_mille": VAL_PER_MILLE,
        "train": write(out, "train", train),
        "val": write(out, "val", val),
        "sources": stats,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = manifest["train"]["bytes"] + manifest["val"]["bytes"]
    print(f"train {manifest['train']['bytes']:,} B in {len(train):,} docs, "
          f"val {manifest['val']['bytes']:,} B in {len(val):,} docs, total {total:,} B")
    for k, v in stats.items():
        print(f"  {k:11s} docs {v['docs']:6d}  train {v['train_bytes']:>11,}  "
              f"val {v['val_bytes']:>9,}  dup-dropped {v['dropped_dup']}")


if __name__ == "__main__":
    main()
