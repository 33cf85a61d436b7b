"""The README documents every configuration key and every metric."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from streamdedup.config import SECTIONS
from streamdedup.ops.telemetry import METRIC_NAMES

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_configuration_key_is_in_the_readme_reference_table():
    missing = []
    for section, cls in SECTIONS.items():
        for spec in dataclasses.fields(cls):
            if f"`{section}.{spec.name}`" not in README and f"`[{section}.{spec.name}]`" not in README:
                missing.append(f"{section}.{spec.name}")
    assert missing == []


def test_every_metric_is_in_the_readme():
    assert [m for m in METRIC_NAMES if f"`{m}" not in README] == []


def test_readme_opens_with_what_it_is_then_the_two_commands():
    head = README.split("## ")[0]
    assert "near-duplicate" in head and "make demo" in head and "make test" in head
