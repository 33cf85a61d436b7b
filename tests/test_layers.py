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
