"""MkDocs hooks of the documentation site: the configuration reference, made from ``streamdedup/config.py``."""

from __future__ import annotations

import dataclasses
import json

MARKER = "<!-- config-reference -->"


def config_reference() -> str:
    """Every configuration key as a Markdown table: key, default, what it means (the ``_key`` docs)."""
    from streamdedup.config import SECTIONS, Config

    defaults = Config()
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for section, cls in SECTIONS.items():
        for spec in dataclasses.fields(cls):
            value = getattr(getattr(defaults, section), spec.name)
            meaning = spec.metadata["doc"].replace("|", "\\|")
            if isinstance(value, dict):
                rows.append(f"| `[{section}.{spec.name}]` | (table) | {meaning} |")
            else:
                rows.append(f"| `{section}.{spec.name}` | `{json.dumps(value)}` | {meaning} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, config_reference())
    return markdown
