"""The documentation covers every configuration key and every metric; README.md stays short and opens right.

The site itself (built strict, its examples run) is tested in ``test_docs_site.py``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

from streamdedup.config import SECTIONS
from streamdedup.ops.telemetry import METRIC_NAMES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PAGES = ROOT / "docs" / "pages"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_lists_every_key_with_its_default_and_meaning():
    hooks = _hooks()
    table = hooks.config_reference()
    missing = []
    for section, cls in SECTIONS.items():
        for spec in dataclasses.fields(cls):
            if f"`{section}.{spec.name}`" not in table and f"`[{section}.{spec.name}]`" not in table:
                missing.append(f"{section}.{spec.name}")
    assert missing == []
    assert '| `lsh.threshold` | `0.7` | exact Jaccard at or above which a document is a duplicate |' in table
    page = (PAGES / "configuration.md").read_text()
    assert hooks.MARKER in page and hooks.on_page_markdown(page, None, None, None).count("| `") > 80


def test_every_metric_is_in_the_operating_page():
    operating = (PAGES / "operating.md").read_text()
    assert [m for m in METRIC_NAMES if f"`{m}" not in operating] == []


def test_the_readme_is_short_and_links_every_page():
    assert len(README.splitlines()) <= 200
    for page in PAGES.glob("*.md"):
        if page.name != "index.md":
            assert f"docs/pages/{page.name}" in README, page.name


def test_readme_opens_with_what_it_is_then_the_two_commands():
    head = README.split("## ")[0]
    assert "near-duplicate" in head and "make demo" in head and "make test" in head
