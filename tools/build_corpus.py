"""Build the training corpus of the bundled teaching pair from openly licensed text and code.

Three sources, all from package registries:

- the reST sources of the Python documentation, installed by Debian's python3.11-doc
  (/usr/share/doc/python3.11/html/_sources/**/*.txt, about 11 MB of English with code examples; PSF);
- the running interpreter's standard library (*.py), without its tests and a few directories
  that are not hand-written code or duplicate the documentation (EXCLUDED_STDLIB_DIRS; PSF);
- the .py files, tests left out, of well-known MIT, BSD and Apache-2.0 projects from the Python Package
  Index, each pinned to one archive by its sha256 (tools/corpus_packages.py: PINNED; about 67 MB). The
  archives are downloaded once into --download_dir with `pip download --no-deps`; later builds are offline.

Each file is one document. Documents are joined with '<|endoftext|>', which the trainer maps to the
eot token (encoder.encode(text, allow_eot=True)). About one document in 50, picked by a hash of its
name, goes to heldout.txt; the rest to train.txt. Everything is sorted, so the same sources give
byte-identical files, and manifest.json records what was used (packages, versions, file lists,
sha256 of each output and of each package archive, each package's licence) so anyone can rebuild the pair.

    python tools/build_corpus.py [--out_dir build/corpus] [--max_stdlib_bytes 8000000]
    python tools/build_corpus.py --packages none      # the documentation and standard library only
"""

import argparse
import hashlib
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

from encoder import EOT
from checkpoints.atomic import write_atomically
from tools import corpus_packages

REPO = Path(__file__).resolve().parents[1]

DOCS_DIR = Path("/usr/share/doc/python3.11/html/_sources")
DOCS_PACKAGE = "python3.11-doc"  # the Debian package that installs DOCS_DIR (models/corpus_manifest.json records it)
STDLIB_DIR = Path(sysconfig.get_paths()["stdlib"])
OUT_DIR = REPO / "build" / "corpus"
DOWNLOAD_DIR = REPO / "build" / "downloads"
RECORDED_MANIFEST = REPO / "models" / "corpus_manifest.json"  # the build the bundled pair was trained on
# The docs are ~11 MB; 8 MB of library code brings the corpus to ~19 MB, in the 15-25 MB range that
# a small pair can learn from in a CPU training budget. The docs hold many code examples already,
# so this keeps the mix close to half prose, half code, with English the larger part because the
# demo prompts are English; the whole library (~10 MB) would tilt it towards code.
MAX_STDLIB_BYTES = 8_000_000
HELDOUT_EVERY = 50
# test suites (mostly fixtures and boilerplate), third-party packages, pydoc_data (a copy of the
# docs text, which would leak held-out documents into training) and encodings (generated tables)
EXCLUDED_STDLIB_DIRS = ("test", "tests", "idle_test", "site-packages", "pydoc_data", "encodings")
LICENCE = "PSF-2.0 (Python Software Foundation License Version 2)"


def name_hash(salt, name):
    """A stable pseudo-random integer per document name; the salt keeps separate uses independent."""
    return int(hashlib.sha256(f"{salt}:{name}".encode()).hexdigest(), 16)


def is_heldout(name, heldout_every):
    return name_hash("heldout", name) % heldout_every == 0


def find_docs(docs_dir):
    """[(document name, path)] for every reST source, sorted by name."""
    return sorted((f"docs/{path.relative_to(docs_dir).as_posix()}", path) for path in docs_dir.rglob("*.txt"))


def find_stdlib(stdlib_dir):
    """[(document name, path)] for the library's .py files outside EXCLUDED_STDLIB_DIRS, sorted."""
    found = []
    for path in stdlib_dir.rglob("*.py"):
        relative = path.relative_to(stdlib_dir)
        if not set(relative.parts[:-1]) & set(EXCLUDED_STDLIB_DIRS):
            found.append((f"stdlib/{relative.as_posix()}", path))
    return sorted(found)


def read_documents(named_paths, skipped):
    """[(name, text)]; files that are not UTF-8 or contain the separator go to `skipped` instead."""
    return decode_documents(((name, path.read_bytes()) for name, path in named_paths), skipped)


def decode_documents(named_bytes, skipped):
    """[(name, text)] from [(name, bytes)], skipping (into `skipped`) what read_documents skips."""
    documents = []
    for name, data in named_bytes:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append({"name": name, "reason": "not UTF-8"})
            continue
        if EOT in text:
            skipped.append({"name": name, "reason": f"contains {EOT}"})
            continue
        documents.append((name, text))
    return documents


def cap_bytes(documents, max_bytes):
    """A spread-out sample of documents within max_bytes: take them in hash order (not alphabetical,
    which would keep asyncio and drop zipfile), skipping any that would overflow; return sorted."""
    chosen, total = [], 0
    for name, text in sorted(documents, key=lambda doc: name_hash("select", doc[0])):
        size = len(text.encode("utf-8"))
        if total + size <= max_bytes:
            chosen.append((name, text))
            total += size
    return sorted(chosen)


def debian_package_of(path):
    """'package version' of the Debian package that installed `path`, or None (not installed by dpkg)."""
    try:
        owner = subprocess.run(["dpkg-query", "-S", str(path)], capture_output=True, text=True, check=True)
        package = owner.stdout.split(":")[0].strip()
        version = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{package} {version.stdout.strip()}"


def output_record(data, documents):
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "documents": len(documents)}


def read_packages(packages, download_dir, download, skipped):
    """([manifest record], [(name, text)] sorted) for the pinned packages, downloading missing archives."""
    records, documents = [], []
    for package in packages:
        archive = corpus_packages.fetch_archive(package, download_dir, download)
        record, sources = corpus_packages.read_package(package, archive)
        package_documents = decode_documents(sources, skipped)
        record.update(files=len(package_documents), bytes=source_bytes(package_documents))
        records.append(record)
        documents += package_documents
    return records, sorted(documents)


def source_bytes(documents):
    return sum(len(text.encode("utf-8")) for _, text in documents)


def build_corpus(out_dir=OUT_DIR, docs_dir=DOCS_DIR, stdlib_dir=STDLIB_DIR, max_stdlib_bytes=MAX_STDLIB_BYTES,
                 heldout_every=HELDOUT_EVERY, packages=(), download_dir=DOWNLOAD_DIR,
                 download=corpus_packages.pip_download):
    """Write train.txt, heldout.txt and manifest.json into out_dir; return the manifest.

    packages: corpus_packages.Package pins whose Python sources join the corpus (none by default)."""
    out_dir, docs_dir, stdlib_dir, download_dir = Path(out_dir), Path(docs_dir), Path(stdlib_dir), Path(download_dir)
    if not docs_dir.is_dir():
        raise ValueError(f"docs_dir {docs_dir} is not a directory: Debian's {DOCS_PACKAGE} installs the Python "
                         f"documentation there (apt-get install {DOCS_PACKAGE}), or pass --docs_dir")
    if not stdlib_dir.is_dir():
        raise ValueError(f"stdlib_dir {stdlib_dir} is not a directory")
    if max_stdlib_bytes < 0 or heldout_every < 2:
        raise ValueError("max_stdlib_bytes must be >= 0 and heldout_every >= 2")

    skipped = []
    docs = read_documents(find_docs(docs_dir), skipped)
    stdlib_all = read_documents(find_stdlib(stdlib_dir), skipped)
    stdlib = cap_bytes(stdlib_all, max_stdlib_bytes)
    package_records, package_documents = read_packages(packages, download_dir, download, skipped)
    documents = docs + package_documents + stdlib  # already sorted: "docs/..." < "pypi/..." < "stdlib/..."
    if not documents:
        raise ValueError(f"no documents found under {docs_dir} or {stdlib_dir}")

    splits = {"train": [], "heldout": []}
    for name, text in documents:
        splits["heldout" if is_heldout(name, heldout_every) else "train"].append((name, text))

    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = {}
    for split, split_documents in splits.items():
        data = EOT.join(text for _, text in split_documents).encode("utf-8")
        write_atomically(out_dir / f"{split}.txt", data)
        outputs[f"{split}.txt"] = output_record(data, split_documents)

    manifest = {
        "description": "Training corpus of the bundled teaching pair, built by tools/build_corpus.py",
        "sources": [
            {"name": "python-docs", "path": str(docs_dir), "debian_package": debian_package_of(docs_dir),
             "files": len(docs), "bytes": source_bytes(docs), "licence": LICENCE},
            {"name": "python-stdlib", "path": str(stdlib_dir), "python": sys.version,
             "excluded_dirs": list(EXCLUDED_STDLIB_DIRS), "files_available": len(stdlib_all),
             "files": len(stdlib), "bytes": source_bytes(stdlib), "max_bytes": max_stdlib_bytes, "licence": LICENCE},
        ] + [{"name": f"pypi-{record['package']}", **record} for record in package_records],
        "excluded_packages": list(corpus_packages.EXCLUDED_PACKAGES),
        "package_test_rule": f"directories {list(corpus_packages.TEST_DIRS)}, "
                             f"files {corpus_packages.TEST_FILE.pattern}",
        "separator": EOT,
        "heldout_rule": f"sha256('heldout:' + name) % {heldout_every} == 0",
        "outputs": outputs,
        "total_bytes": sum(record["bytes"] for record in outputs.values()),
        "skipped": skipped,
        "documents": {split: [name for name, _ in split_documents] for split, split_documents in splits.items()},
    }
    write_atomically(out_dir / "manifest.json", (json.dumps(manifest, indent=1, ensure_ascii=False) + "\n").encode())
    return manifest


def differences_from_record(manifest, recorded):
    """What makes this build's outputs differ from the recorded build's, one line per source; [] when they match.

    The documentation comes from whatever DOCS_PACKAGE the machine's package lists offer: stale lists
    install an older revision (one was 1,956 bytes shorter), hence the hint.
    """
    if manifest["outputs"] == recorded["outputs"]:
        return []
    fields = ("debian_package", "python", "version", "files", "bytes")
    recorded_sources = {source["name"]: source for source in recorded["sources"]}
    lines, other_debian_package = [], False
    for source in manifest["sources"]:
        before = recorded_sources.get(source["name"], {})
        changed = [field for field in fields if field in source and source[field] != before.get(field)]
        if changed:
            lines.append(f"{source['name']}: " + ", ".join(f"{field} {source[field]} (recorded: {before.get(field)})"
                                                           for field in changed))
        other_debian_package |= "debian_package" in changed
    built = {source["name"] for source in manifest["sources"]}
    lines += [f"{name}: not in this build" for name in sorted(recorded_sources.keys() - built)]
    if other_debian_package:
        lines.append(f"for the recorded documentation: apt-get update && apt-get install -y {DOCS_PACKAGE}")
    return lines or ["the same sources, yet other outputs"]


def chosen_packages(spec):
    """'pinned' (all of PINNED), 'none', or comma-separated names from PINNED."""
    if spec == "pinned":
        return list(corpus_packages.PINNED)
    if spec == "none":
        return []
    by_name = {package.name: package for package in corpus_packages.PINNED}
    unknown = [name for name in spec.split(",") if name not in by_name]
    if unknown:
        raise ValueError(f"not pinned in tools/corpus_packages.py: {', '.join(unknown)}")
    return [by_name[name] for name in spec.split(",")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out_dir", type=Path, default=OUT_DIR)
    parser.add_argument("--docs_dir", type=Path, default=DOCS_DIR)
    parser.add_argument("--stdlib_dir", type=Path, default=STDLIB_DIR)
    parser.add_argument("--max_stdlib_bytes", type=int, default=MAX_STDLIB_BYTES)
    parser.add_argument("--heldout_every", type=int, default=HELDOUT_EVERY)
    parser.add_argument("--packages", default="pinned", help="'pinned' (all), 'none', or names from the pinned list")
    parser.add_argument("--download_dir", type=Path, default=DOWNLOAD_DIR, help="where package archives are kept")
    args = parser.parse_args(argv)
    try:
        manifest = build_corpus(**{**vars(args), "packages": chosen_packages(args.packages)})
    except (ValueError, OSError, subprocess.CalledProcessError) as error:
        sys.exit(f"build_corpus: error: {error}")
    for source in manifest["sources"]:
        print(f"{source['name']}: {source['files']} files, {source['bytes']:,} bytes ({source['licence']})")
    for name, record in manifest["outputs"].items():
        print(f"{args.out_dir / name}: {record['documents']} documents, {record['bytes']:,} bytes")
    if RECORDED_MANIFEST.exists():
        differences = differences_from_record(manifest, json.loads(RECORDED_MANIFEST.read_text(encoding="utf-8")))
        print("the same bytes as the recorded build (models/corpus_manifest.json)" if not differences else
              "differs from the recorded build (models/corpus_manifest.json):\n  " + "\n  ".join(differences))


if __name__ == "__main__":
    main()
