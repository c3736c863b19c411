"""Python source from permissively licensed packages on the Python Package Index, for the training corpus.

Each package is pinned to one archive (a wheel or an sdist) by name, version, file name and sha256, so
the corpus is the same wherever it is rebuilt. `fetch_archive` downloads it with `pip download --no-deps`
unless a file with that hash is already in the download folder; `read_package` then checks the licence
in the archive's own metadata (METADATA in a wheel, PKG-INFO in an sdist) and returns its .py files,
leaving out tests (see `is_test_path`). NumPy is never taken: its sources are kept unseen for evaluation.
"""

import email
import hashlib
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import PurePosixPath

# Licence families accepted, as the manifest names them.
ALLOWED_LICENCES = ("MIT", "BSD", "Apache-2.0", "PSF")
# SPDX identifiers (the License-Expression field, PEP 639) of those families
SPDX_FAMILIES = {"MIT": "MIT", "BSD-2-Clause": "BSD", "BSD-3-Clause": "BSD", "Apache-2.0": "Apache-2.0",
                 "PSF-2.0": "PSF", "Python-2.0": "PSF"}
# the older free-text License field, when it is a short name rather than the licence's full text
LICENCE_NAMES = [(r"(the )?mit( license)?", "MIT"), (r"(new |modified |simplified )?bsd( license)?", "BSD"),
                 (r"bsd[- ][23][- ]clause( license)?", "BSD"),
                 (r"apache( software)?( license)?,?( version)? ?2(\.0)?( license)?", "Apache-2.0"),
                 (r"apache-2\.0", "Apache-2.0"), (r"psf|python software foundation license", "PSF")]
# trove classifiers: every licence classifier of a package must be one of these
CLASSIFIER_FAMILIES = {"License :: OSI Approved :: MIT License": "MIT",
                       "License :: OSI Approved :: BSD License": "BSD",
                       "License :: OSI Approved :: Apache Software License": "Apache-2.0",
                       "License :: OSI Approved :: Python Software Foundation License": "PSF"}
# Kept out of the corpus: NumPy's sources are the unseen Python we evaluate on.
EXCLUDED_PACKAGES = ("numpy",)
TEST_DIRS = ("test", "tests", "testing", "benchmarks")
TEST_FILE = re.compile(r"(test_.*|.*_tests?|conftest|tests?)\.py")


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    filename: str  # the archive on the index: a .whl or an sdist (.tar.gz)
    sha256: str

    @property
    def is_wheel(self):
        return self.filename.endswith(".whl")


# Well-known pure-Python projects under MIT, BSD or Apache-2.0 licences (checked again from each archive's
# metadata when the corpus is built): about 67 MB of .py source without tests.
PINNED = [
    Package("attrs", "26.1.0", "attrs-26.1.0-py3-none-any.whl",
            "c647aa4a12dfbad9333ca4e71fe62ddc36f4e63b2d260a37a8b83d2f043ac309"),
    Package("babel", "2.18.0", "babel-2.18.0-py3-none-any.whl",
            "e2b422b277c2b9a9630c1d7903c2a00d0830c409c59ac8cae9081c92f1aeba35"),
    Package("black", "26.10.1", "black-26.10.1-py3-none-any.whl",
            "28842f9a8207cc1df6eb983a35a14c5a0dfcd603d214fe82d84bef552afd2e3a"),
    Package("click", "8.5.1", "click-8.5.1-py3-none-any.whl",
            "8bb5376d2006950386f8c6427613334a2acadc5f559cb80e638d00b4df957e37"),
    Package("dask", "2026.8.0", "dask-2026.8.0-py3-none-any.whl",
            "ccc0c83a189b0398602435189771d28dad7b5773b6089bb8dce14ae732dd782c"),
    Package("django", "5.2.19", "django-5.2.19-py3-none-any.whl",
            "5965d974a5218a2b68a11dd1276434707f23886525c23f0598eccedaf4f4ca00"),
    Package("flask", "3.1.3", "flask-3.1.3-py3-none-any.whl",
            "f4bcbefc124291925f1a26446da31a5178f9483862233b23c0c96a20701f670c"),
    Package("ipython", "9.18.1", "ipython-9.18.1-py3-none-any.whl",
            "997ce9140d374531a61069c70c0f9ef299d6dd3559ea0f94b8af589726e3c1d5"),
    Package("jinja2", "3.1.6", "jinja2-3.1.6-py3-none-any.whl",
            "85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67"),
    Package("markdown", "3.11.3", "markdown-3.11.3-py3-none-any.whl",
            "e1a31a112232504d753e5c01bb8c2de90d3f0ba986b063e10770cf7695b09e73"),
    Package("mpmath", "1.4.1", "mpmath-1.4.1-py3-none-any.whl",
            "dc4f0ea2304480d4a9a48a94c1020571558ade522b44a6912efac63a586e140f"),
    Package("networkx", "3.6.1", "networkx-3.6.1-py3-none-any.whl",
            "d47fbf302e7d9cbbb9e2555a0d267983d2aa476bac30e90dfbe5669bd57f3762"),
    Package("prompt_toolkit", "3.0.53", "prompt_toolkit-3.0.53-py3-none-any.whl",
            "01c0891d7f9237d5e339f7d3e42cdae80b7534abb1c7c0e3352efba6231492f2"),
    Package("pydantic", "2.14.3", "pydantic-2.14.3-py3-none-any.whl",
            "3f7b347782ab7e4cf4c798496ae3a82787d9f21ec12676a9c564355eeef8daa8"),
    Package("pygments", "2.21.0", "pygments-2.21.0-py3-none-any.whl",
            "2363c69b61c4a97c838da3b130dcd6468f4848992b21a82f2a63ec34377137d9"),
    Package("pyparsing", "3.3.3", "pyparsing-3.3.3-py3-none-any.whl",
            "ece8c00a69cf01b45d0b1dedabb469c90d8caf996d4fda40f147627a122849a4"),
    Package("requests", "2.34.2", "requests-2.34.2-py3-none-any.whl",
            "2a0d60c172f83ac6ab31e4554906c0f3b3588d37b5cb939b1c061f4907e278e0"),
    Package("rich", "15.0.0", "rich-15.0.0-py3-none-any.whl",
            "33bd4ef74232fb73fe9279a257718407f169c09b78a87ad3d296f548e27de0bb"),
    Package("sphinx", "9.0.4", "sphinx-9.0.4-py3-none-any.whl",
            "5bebc595a5e943ea248b99c13814c1c5e10b3ece718976824ffa7959ff95fffb"),
    Package("sqlalchemy", "2.1.9", "sqlalchemy-2.1.9-py3-none-any.whl",
            "449fed5c2caa3b278cc57499d09db001fb3f28dc7f18affc48142aee4dcc0cdf"),
    Package("sympy", "1.14.0", "sympy-1.14.0-py3-none-any.whl",
            "e091cc3e99d2141a0ba2847328f5479b05d94a6635cb96148ccb3f34671bd8f5"),
    Package("tornado", "6.6.1", "tornado-6.6.1.tar.gz",
            "28e6311402af59c8b02e3fa0f5e7d8eb465b25081381803b127d97e6a4395d5a"),
    Package("twisted", "26.10.0", "twisted-26.10.0-py3-none-any.whl",
            "3732f42af218925a0fe78d6668db55853f7fb532245a89a2669babe7d3000fa8"),
    Package("werkzeug", "3.1.9", "werkzeug-3.1.9-py3-none-any.whl",
            "6392e50c78460ba618e5b21f08a71f59c99ce99cdc6cf6e3dd7e6ccca8754fab"),
    Package("xarray", "2026.9.0", "xarray-2026.9.0-py3-none-any.whl",
            "fe349fa871628b1a0a5217af3fe1283a2862d5485156e6eda354fffb81c3bb7c"),
]


def is_test_path(path):
    """True for a file of a test suite or benchmark: under a test directory, or named like a test module."""
    parts = PurePosixPath(path).parts
    return bool(set(parts[:-1]) & set(TEST_DIRS)) or bool(TEST_FILE.fullmatch(parts[-1]))


def licence_family(metadata):
    """(family in ALLOWED_LICENCES or None, the metadata's own words) for a package's core metadata.

    The SPDX License-Expression decides when present (only a single allowed identifier passes); else a
    License field that is a short name (an unknown name fails); else the trove classifiers, all of which
    must be allowed."""
    expression = (metadata.get("License-Expression") or "").strip()
    if expression:
        return SPDX_FAMILIES.get(expression), f"License-Expression: {expression}"
    field = (metadata.get("License") or "").strip()
    if field and "\n" not in field and len(field) <= 80:  # a name, not a licence's full text
        families = [family for pattern, family in LICENCE_NAMES if re.fullmatch(pattern, field, flags=re.IGNORECASE)]
        return (families[0] if families else None), f"License: {field}"
    classifiers = [c for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")]
    if classifiers:
        families = {CLASSIFIER_FAMILIES.get(c) for c in classifiers}
        family = families.pop() if len(families) == 1 else None
        return family, "; ".join(classifiers)
    return None, f"License: {field[:80]}" if field else "no licence metadata"


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pip_download(package, dest):
    """Download one pinned archive into dest with pip (no dependencies: each project is pinned by itself)."""
    kind = ["--only-binary=:all:", "--platform", "any", "--python-version", "3.11"] if package.is_wheel \
        else ["--no-binary=:all:"]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *kind, "--dest", str(dest),
               f"{package.name}=={package.version}"]
    subprocess.run(command, check=True)


def fetch_archive(package, download_dir, download=pip_download):
    """The path of the package's archive in download_dir, downloaded when missing; its hash must match."""
    if package.name.lower() in EXCLUDED_PACKAGES:
        raise ValueError(f"{package.name} is kept out of the corpus (its sources are for evaluation)")
    path = download_dir / package.filename
    if not path.exists():
        download_dir.mkdir(parents=True, exist_ok=True)
        download(package, download_dir)
        if not path.exists():
            raise ValueError(f"downloading {package.name}=={package.version} did not produce {package.filename}")
    found = sha256_of(path)
    if found != package.sha256:
        raise ValueError(f"{path} has sha256 {found}, pinned {package.sha256}")
    return path


def archive_members(path):
    """[(path inside the package, bytes)] of every regular file, in archive order; an sdist loses its top folder."""
    if path.name.endswith(".whl"):
        with zipfile.ZipFile(path) as archive:
            return [(info.filename, archive.read(info)) for info in archive.infolist() if not info.is_dir()]
    with tarfile.open(path) as archive:
        return [(member.name.split("/", 1)[1], archive.extractfile(member).read())
                for member in archive.getmembers() if member.isfile() and "/" in member.name]


def read_metadata(members, is_wheel):
    """The core metadata: a wheel's *.dist-info/METADATA, or an sdist's top-level PKG-INFO."""
    for name, data in members:
        if (is_wheel and re.fullmatch(r"[^/]+\.dist-info/METADATA", name)) or (not is_wheel and name == "PKG-INFO"):
            return email.message_from_bytes(data)
    raise ValueError("no core metadata (METADATA or PKG-INFO) in the archive")


def read_package(package, archive_path):
    """(record for the manifest, [(document name, bytes)] sorted) for the package's .py files, without tests
    and empty files (an empty __init__.py would be a document of nothing but the separator).

    Raises ValueError when the archive's metadata names another project or version, or a licence
    outside ALLOWED_LICENCES."""
    members = archive_members(archive_path)
    metadata = read_metadata(members, package.is_wheel)
    name, version = metadata.get("Name", ""), metadata.get("Version", "")
    if (name.lower().replace("_", "-"), version) != (package.name.lower().replace("_", "-"), package.version):
        raise ValueError(f"{archive_path.name} holds {name} {version}, not {package.name} {package.version}")
    family, words = licence_family(metadata)
    if family not in ALLOWED_LICENCES:
        raise ValueError(f"{package.name} {package.version}: licence not accepted ({words})")
    sources = [(path, data) for path, data in members if path.endswith(".py")]
    not_tests = [(path, data) for path, data in sources if not is_test_path(path)]
    kept = sorted((f"pypi/{package.name}/{path}", data) for path, data in not_tests if data.strip())
    record = {"package": package.name, "version": package.version, "archive": package.filename,
              "archive_sha256": package.sha256, "index": "PyPI", "licence": family, "licence_metadata": words,
              "py_files": len(sources), "test_files_left_out": len(sources) - len(not_tests),
              "empty_files_left_out": len(not_tests) - len(kept)}
    return record, kept
