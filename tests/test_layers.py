"""The package's layers hold: the import contracts in pyproject.toml, checked by import-linter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.system  # every test here starts processes


def test_imports_keep_to_the_layers():
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_core_loads_neither_lmdb_nor_kafka():
    """A preparing process imports the core alone: it boots fast and shares no client or environment."""
    code = ("import sys, streamdedup.core.prepare; "
            "print(sorted(m for m in ('lmdb', 'kafka') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


def test_a_signing_process_loads_no_engine_and_no_index():
    """``run --role sign`` prepares and sends: the engine (deciding, the vshards' stages) and the index are the
    hosts' (about 0.1 s of CPU at each signer's start)."""
    code = ("import sys, streamdedup.cli, streamdedup.runtime.sessions, streamdedup.runtime.vshards.sign; "
            "print(sorted(m for m in ('streamdedup.engine.engine', 'streamdedup.engine.vshards.vshard', "
            "'streamdedup.store.index', 'lmdb') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_a_vshards_host_loads_none_of_the_single_workers_modules():
    """``run --role vshards`` decides with the vshards' stages: the single worker's session, its feed (and
    multiprocessing), its progress bar and access check are not a host's (about 0.04 s of CPU at each host's
    start)."""
    code = ("import sys, streamdedup.cli, streamdedup.runtime.vshards.host; "
            "print(sorted(m for m in ('streamdedup.runtime.worker', 'streamdedup.runtime.feed', "
            "'streamdedup.ops.progress', 'streamdedup.runtime.access', 'multiprocessing') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
