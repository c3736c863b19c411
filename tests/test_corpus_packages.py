"""tools/corpus_packages.py and the package part of tools/build_corpus.py, on tiny archives made here:
the licence filter, the test-file exclusion, hash-pinned fetching and the manifest's provenance. No network."""

import email
import hashlib
import io
import json
import re
import tarfile
import zipfile

import pytest

from conftest import REPO
from encoder import EOT
from tools import build_corpus, corpus_packages
from tools.corpus_packages import Package

SOURCES = {
    "fakepkg/__init__.py": "",  # empty: left out
    "fakepkg/core.py": "def add(a, b):\n    return a + b\n",
    "fakepkg/sub/util.py": "VALUE = 'caf\u00e9'\n",
    "fakepkg/tests/test_core.py": "def test_add():\n    assert True\n",
    "fakepkg/test_util.py": "def test_util():\n    pass\n",
    "fakepkg/util_test.py": "def test_util():\n    pass\n",
    "fakepkg/conftest.py": "import pytest\n",
    "fakepkg/benchmarks/bench_core.py": "print('fast')\n",
    "fakepkg/testing/helpers.py": "HELP = 1\n",
    "fakepkg/data.json": "{}\n",
}
KEPT = ["pypi/fakepkg/fakepkg/core.py", "pypi/fakepkg/fakepkg/sub/util.py"]


def metadata(**fields):
    message = email.message.Message()
    for key, value in fields.items():
        for item in value if isinstance(value, list) else [value]:
            message[key.replace("_", "-")] = item
    return message


def metadata_text(name="fakepkg", version="1.0", **fields):
    return f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n" + str(metadata(**fields))


def make_wheel(directory, name="fakepkg", version="1.0", **licence_fields):
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in SOURCES.items():
            archive.writestr(member, text)
        archive.writestr(f"{name}-{version}.dist-info/METADATA", metadata_text(name, version, **licence_fields))
    return Package(name, version, path.name, hashlib.sha256(path.read_bytes()).hexdigest()), path


def make_sdist(directory, name="fakepkg", version="1.0", **licence_fields):
    path = directory / f"{name}-{version}.tar.gz"
    members = {**SOURCES, "PKG-INFO": metadata_text(name, version, **licence_fields), "setup.py": "setup()\n"}
    with tarfile.open(path, "w:gz") as archive:
        for member, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-{version}/{member}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return Package(name, version, path.name, hashlib.sha256(path.read_bytes()).hexdigest()), path


@pytest.mark.parametrize("fields, family", [
    ({"License_Expression": "MIT"}, "MIT"),
    ({"License_Expression": "BSD-3-Clause"}, "BSD"),
    ({"License_Expression": "Apache-2.0", "License": "GPL"}, "Apache-2.0"),  # the SPDX expression decides
    ({"License_Expression": "GPL-3.0-only"}, None),
    ({"License_Expression": "MIT OR GPL-2.0-only"}, None),  # only a single allowed identifier passes
    ({"License": "BSD"}, "BSD"),
    ({"License": "Apache License, Version 2.0"}, "Apache-2.0"),
    ({"License": "new BSD License"}, "BSD"),
    ({"License": "GPLv3", "Classifier": "License :: OSI Approved :: MIT License"}, None),  # a name we do not accept
    ({"License": "Copyright (c) 2020\nPermission is hereby granted...",
      "Classifier": "License :: OSI Approved :: MIT License"}, "MIT"),  # full text: the classifiers decide
    ({"Classifier": ["License :: OSI Approved :: BSD License", "Programming Language :: Python"]}, "BSD"),
    ({"Classifier": ["License :: OSI Approved :: MIT License",
                     "License :: OSI Approved :: GNU General Public License v3 (GPLv3)"]}, None),
    ({"Classifier": "License :: OSI Approved :: Python Software Foundation License"}, "PSF"),
    ({}, None),
])
def test_licence_filter(fields, family):
    assert corpus_packages.licence_family(metadata(**fields))[0] == family


@pytest.mark.parametrize("path, is_test", [
    ("pkg/core.py", False), ("pkg/tests/test_core.py", True), ("pkg/test/helpers.py", True),
    ("pkg/testing/runner.py", True), ("pkg/benchmarks/bench.py", True), ("pkg/test_x.py", True),
    ("pkg/x_test.py", True), ("pkg/x_tests.py", True), ("pkg/conftest.py", True), ("pkg/tests.py", True),
    ("pkg/latest.py", False), ("pkg/contest.py", False), ("pkg/attestation.py", False), ("tests_helpers/x.py", False),
])
def test_test_files_are_recognised(path, is_test):
    assert corpus_packages.is_test_path(path) == is_test


@pytest.mark.parametrize("make", [make_wheel, make_sdist])
def test_read_package_keeps_sources_without_tests(tmp_path, make):
    package, path = make(tmp_path, License_Expression="MIT")
    record, documents = corpus_packages.read_package(package, path)
    sdist_top = ["pypi/fakepkg/setup.py"] if make is make_sdist else []  # an sdist's top folder is stripped
    assert [name for name, _ in documents] == KEPT + sdist_top
    assert documents[1][1] == SOURCES["fakepkg/sub/util.py"].encode()
    python_files = sum(name.endswith(".py") for name in SOURCES) + len(sdist_top)
    assert record["py_files"] == python_files and record["test_files_left_out"] == 6
    assert record["empty_files_left_out"] == 1
    assert record["licence"] == "MIT" and record["archive_sha256"] == package.sha256
    assert record["package"] == "fakepkg" and record["version"] == "1.0"


def test_read_package_refuses_other_licences_and_mismatched_archives(tmp_path):
    package, path = make_wheel(tmp_path, License_Expression="GPL-3.0-or-later")
    with pytest.raises(ValueError, match="licence not accepted.*GPL-3.0-or-later"):
        corpus_packages.read_package(package, path)
    package, path = make_wheel(tmp_path / "", name="otherpkg", License="MIT")
    with pytest.raises(ValueError, match="holds otherpkg 1.0, not fakepkg 1.0"):
        corpus_packages.read_package(Package("fakepkg", "1.0", path.name, package.sha256), path)


def test_fetch_archive_downloads_once_and_checks_the_hash(tmp_path):
    source, downloads = tmp_path / "index", tmp_path / "downloads"
    source.mkdir()
    package, path = make_wheel(source, License_Expression="MIT")
    calls = []

    def download(wanted, dest):
        calls.append(wanted.name)
        (dest / wanted.filename).write_bytes(path.read_bytes())

    assert corpus_packages.fetch_archive(package, downloads, download) == downloads / package.filename
    assert corpus_packages.fetch_archive(package, downloads, download) == downloads / package.filename
    assert calls == ["fakepkg"]  # the second call found the archive
    with pytest.raises(ValueError, match="has sha256 .* pinned 0+"):
        corpus_packages.fetch_archive(Package("fakepkg", "1.0", package.filename, "0" * 64), downloads, download)
    with pytest.raises(ValueError, match="did not produce"):
        corpus_packages.fetch_archive(Package("missing", "2.0", "missing-2.0.whl", "0" * 64), downloads,
                                      lambda wanted, dest: None)
    with pytest.raises(ValueError, match="numpy is kept out"):
        corpus_packages.fetch_archive(Package("numpy", "2.4.6", "numpy.whl", "0" * 64), downloads, download)


def test_pinned_packages_are_well_formed():
    names = [package.name for package in corpus_packages.PINNED]
    assert len(names) == len(set(names)) and not set(names) & set(corpus_packages.EXCLUDED_PACKAGES)
    for package in corpus_packages.PINNED:
        assert re.fullmatch(r"[0-9a-f]{64}", package.sha256)
        assert package.filename.lower().startswith(f"{package.name}-{package.version}".lower())
        assert package.filename.endswith((".whl", ".tar.gz"))
    assert build_corpus.chosen_packages("pinned") == corpus_packages.PINNED
    assert build_corpus.chosen_packages("none") == []
    assert [p.name for p in build_corpus.chosen_packages("flask,django")] == ["flask", "django"]
    with pytest.raises(ValueError, match="not pinned.*nosuch"):
        build_corpus.chosen_packages("flask,nosuch")


@pytest.fixture
def small_sources(tmp_path):
    docs, stdlib = tmp_path / "docs", tmp_path / "stdlib"
    docs.mkdir()
    stdlib.mkdir()
    for i in range(12):
        (docs / f"page{i:02d}.rst.txt").write_text(f"Page {i}\n\nProse about topic {i}.\n", encoding="utf-8")
        (stdlib / f"mod{i:02d}.py").write_text(f"def f{i}():\n    return {i}\n")
    return docs, stdlib


def test_build_corpus_adds_packages_with_their_provenance(tmp_path, small_sources):
    docs, stdlib = small_sources
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    wheel, _ = make_wheel(downloads, License_Expression="BSD-3-Clause")
    sdist, _ = make_sdist(downloads, name="otherpkg", version="2.5", License="Apache 2.0")

    def no_network(package, dest):
        raise AssertionError("every archive is already in download_dir")

    options = dict(docs_dir=docs, stdlib_dir=stdlib, heldout_every=3, download_dir=downloads, download=no_network)
    manifest = build_corpus.build_corpus(out_dir=tmp_path / "a", packages=[wheel, sdist], **options)
    build_corpus.build_corpus(out_dir=tmp_path / "b", packages=[wheel, sdist], **options)
    for name in ["train.txt", "heldout.txt", "manifest.json"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert json.loads((tmp_path / "a" / "manifest.json").read_text()) == manifest

    by_name = {source["name"]: source for source in manifest["sources"]}
    assert list(by_name) == ["python-docs", "python-stdlib", "pypi-fakepkg", "pypi-otherpkg"]
    assert by_name["pypi-fakepkg"]["licence"] == "BSD" and by_name["pypi-otherpkg"]["licence"] == "Apache-2.0"
    assert by_name["pypi-otherpkg"]["archive"] == "otherpkg-2.5.tar.gz"
    wheel_bytes = (downloads / wheel.filename).read_bytes()
    assert by_name["pypi-fakepkg"]["archive_sha256"] == hashlib.sha256(wheel_bytes).hexdigest()
    assert by_name["pypi-fakepkg"]["files"] == 2 and by_name["pypi-otherpkg"]["files"] == 3  # + setup.py
    assert by_name["pypi-fakepkg"]["bytes"] == len(SOURCES["fakepkg/core.py"].encode()) + len(
        SOURCES["fakepkg/sub/util.py"].encode())

    every = manifest["documents"]["train"] + manifest["documents"]["heldout"]
    package_names = [name for name in every if name.startswith("pypi/")]
    assert sorted(package_names) == sorted(KEPT + [n.replace("fakepkg", "otherpkg", 1) for n in KEPT]
                                           + ["pypi/otherpkg/setup.py"])
    for split in ["train", "heldout"]:
        names = manifest["documents"][split]
        assert names == sorted(names)  # docs/ < pypi/ < stdlib/
        assert all(build_corpus.is_heldout(name, 3) == (split == "heldout") for name in names)
        text = (tmp_path / "a" / f"{split}.txt").read_text(encoding="utf-8")
        assert text.count(EOT) == len(names) - 1 and "def test_" not in text


def test_the_held_out_split_depends_only_on_each_document_name(tmp_path, small_sources):
    """Adding packages never moves a documentation or library file between the splits."""
    docs, stdlib = small_sources
    wheel, _ = make_wheel(tmp_path, License_Expression="MIT")
    without = build_corpus.build_corpus(out_dir=tmp_path / "a", docs_dir=docs, stdlib_dir=stdlib, heldout_every=3)
    with_package = build_corpus.build_corpus(out_dir=tmp_path / "b", docs_dir=docs, stdlib_dir=stdlib,
                                             heldout_every=3, packages=[wheel], download_dir=tmp_path)
    for split in ["train", "heldout"]:
        kept = [name for name in with_package["documents"][split] if not name.startswith("pypi/")]
        assert kept == without["documents"][split]
    assert without["documents"]["heldout"] and without["documents"]["train"]


def test_build_corpus_stops_on_a_refused_licence(tmp_path, small_sources):
    docs, stdlib = small_sources
    wheel, _ = make_wheel(tmp_path, License="GPL")
    with pytest.raises(ValueError, match="fakepkg 1.0: licence not accepted"):
        build_corpus.build_corpus(out_dir=tmp_path / "out", docs_dir=docs, stdlib_dir=stdlib, packages=[wheel],
                                  download_dir=tmp_path)
    assert not (tmp_path / "out").exists()


def test_the_committed_manifest_matches_the_pins_and_the_rules():
    """models/corpus_manifest.json, written by the build the model card reports, agrees with the code."""
    manifest = json.loads((REPO / "models" / "corpus_manifest.json").read_text(encoding="utf-8"))
    packages = {s["package"]: s for s in manifest["sources"] if s["name"].startswith("pypi-")}
    assert {(p.name, p.version, p.filename, p.sha256) for p in corpus_packages.PINNED} == {
        (s["package"], s["version"], s["archive"], s["archive_sha256"]) for s in packages.values()}
    assert all(s["licence"] in corpus_packages.ALLOWED_LICENCES for s in packages.values())
    every = manifest["documents"]["train"] + manifest["documents"]["heldout"]
    assert sum(s["files"] for s in manifest["sources"]) == len(every) == len(set(every))
    assert not [name for name in every if "numpy" in name.split("/")[:3]]
    package_files = [name.split("/", 2)[2] for name in every if name.startswith("pypi/")]
    assert len(package_files) == sum(s["files"] for s in packages.values())
    assert not [path for path in package_files if corpus_packages.is_test_path(path)]
    for split in ["train", "heldout"]:
        assert all(build_corpus.is_heldout(name, 50) == (split == "heldout") for name in manifest["documents"][split])


def test_a_build_says_how_it_differs_from_the_recorded_one():
    """Stale package lists once installed an older python3.11-doc: the build names it and the cure."""
    from tools import build_corpus

    recorded = json.loads((REPO / "models" / "corpus_manifest.json").read_text(encoding="utf-8"))
    assert build_corpus.differences_from_record(recorded, recorded) == []
    older = json.loads(json.dumps(recorded))
    older["sources"][0].update(debian_package="python3.11-doc 3.11.2-6+deb12u8", bytes=11_046_319)
    older["outputs"]["train.txt"].update(bytes=84_036_466, sha256="405b14bb")
    older["sources"] = [source for source in older["sources"] if source["name"] != "pypi-xarray"]
    lines = build_corpus.differences_from_record(older, recorded)
    assert lines[0] == ("python-docs: debian_package python3.11-doc 3.11.2-6+deb12u8 (recorded: python3.11-doc "
                        "3.11.2-6+deb12u9), bytes 11046319 (recorded: 11048275)")
    assert "pypi-xarray: not in this build" in lines
    assert lines[-1] == "for the recorded documentation: apt-get update && apt-get install -y python3.11-doc"


def test_a_missing_documentation_folder_names_the_debian_package_that_installs_it(tmp_path):
    recorded = json.loads((REPO / "models" / "corpus_manifest.json").read_text(encoding="utf-8"))
    assert recorded["sources"][0]["debian_package"].split()[0] == build_corpus.DOCS_PACKAGE  # what the pair used
    with pytest.raises(SystemExit) as exit:
        build_corpus.main(["--docs_dir", str(tmp_path / "nowhere"), "--out_dir", str(tmp_path / "out")])
    message = str(exit.value.code)
    assert message.startswith("build_corpus: error: docs_dir ") and "\n" not in message
    assert f"apt-get install {build_corpus.DOCS_PACKAGE}" in message and "--docs_dir" in message
    assert not (tmp_path / "out").exists()
