"""The package as users get it: sdist and wheel built by ``python -m build``, the wheel in a fresh virtualenv.

Everything runs from a temporary folder, so nothing is imported from the
source tree. The build and the install fetch their requirements through pip
(cached after the first run).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from streamdedup import __version__

ROOT = Path(__file__).resolve().parent.parent


def run(command: list[str] | str, cwd: Path, env: dict | None = None, timeout: float = 900) -> str:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                            shell=isinstance(command, str))
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], cwd=out)
    return out


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A fresh virtualenv (no system site-packages) with only the wheel and its dependencies."""
    place = tmp_path_factory.mktemp("venv") / "venv"
    run([sys.executable, "-m", "venv", str(place)], cwd=place.parent)
    wheel = next(dist.glob("*.whl"))
    run([str(place / "bin" / "pip"), "install", "--quiet", str(wheel)], cwd=place.parent)
    return place


def test_the_sdist_carries_the_build_inputs_and_the_license(dist):
    sdist = next(dist.glob("streamdedup-*.tar.gz"))
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"setup.py", "pyproject.toml", "LICENSE", "README.md", "config.toml",
            "streamdedup/core/_kernel.c", "streamdedup/cli.py", "streamdedup/py.typed"} <= names
    assert not any(name.endswith((".so", ".pyc")) for name in names)


def test_the_wheel_has_the_kernel_and_complete_metadata(dist):
    wheel = next(dist.glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = Parser().parsestr(archive.read(f"streamdedup-{__version__}.dist-info/METADATA").decode())
    assert any(re.fullmatch(r"streamdedup/core/_kernel\..*\.so", n) for n in names)
    assert f"streamdedup-{__version__}.dist-info/licenses/LICENSE" in names
    assert "streamdedup/py.typed" in names
    assert metadata["Version"] == __version__ and metadata["License-Expression"] == "Apache-2.0"
    urls = dict(value.split(", ", 1) for value in metadata.get_all("Project-URL"))
    assert {"Homepage", "Source", "Issues", "Documentation"} <= set(urls)
    classifiers = metadata.get_all("Classifier")
    assert "Programming Language :: Python :: 3.11" in classifiers and len(classifiers) >= 8
    assert any(r.startswith("prometheus_client") for r in metadata.get_all("Requires-Dist"))


@pytest.mark.system
def test_the_installed_wheel_runs_help_version_and_the_readme_offline_example(venv, tmp_path):
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYTHONPATH", None)
    where = run([str(venv / "bin" / "python"), "-c",
                 "import streamdedup, streamdedup.core._kernel as k; print(streamdedup.__file__); print(k.__file__)"],
                cwd=tmp_path, env=env).split()
    assert all(path.startswith(str(venv)) for path in where), where  # not the source tree
    assert "usage: streamdedup" in run(["streamdedup", "--help"], cwd=tmp_path, env=env)
    assert run(["streamdedup", "--version"], cwd=tmp_path, env=env).strip() == f"streamdedup {__version__}"
    for line in readme_offline_example():
        run(line, cwd=tmp_path, env=env)
    documents = (tmp_path / "crawl.jsonl").read_text().splitlines()
    decisions = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    kept = (tmp_path / "clean.jsonl").read_text().splitlines()
    assert len(decisions) == len(documents) > 1000
    assert 0 < len(kept) < len(documents) and set(kept) <= set(documents)
    assert sum(d["status"] == "kept" for d in decisions) == len(kept)


def readme_offline_example() -> list[str]:
    """The first two commands of README's first offline run: make the sample crawl, deduplicate it."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## A first offline run.*?```console\n(.*?)```", readme, re.S).group(1)
    commands = [line[2:].strip() for line in block.splitlines() if line.startswith("$ ")]
    commands = [c for c in commands if c.startswith("streamdedup sample") or c.startswith("streamdedup dedup crawl")]
    assert len(commands) == 2, commands
    return commands
