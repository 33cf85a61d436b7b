"""``bench/live.py --variants``: which web crawl contenders a run measures (issue 31, item 5: the live rate
with template learning against the rate without it)."""

from __future__ import annotations

import pytest

from bench import live


def test_all_contenders_by_default_and_templates_off_always_as_the_base():
    assert live.web_contenders("") == list(live.WEB_VARIANTS)
    assert live.web_contenders("templates (default)") == ["templates (default)", "templates off"]
    both = live.web_contenders("templates (default);templates, repeats off")
    assert both == ["templates (default)", "templates, repeats off", "templates off"]
    assert live.web_contenders("templates off;templates (default)") == ["templates off", "templates (default)"]


def test_an_unknown_contender_is_refused_with_the_names_to_choose_from():
    with pytest.raises(SystemExit, match="templates, repeats off"):
        live.web_contenders("templates, repeats")


def test_learning_on_and_off_are_both_contenders():
    """The default learns what each site repeats; a contender turns it off, one turns templates off."""
    assert live.WEB_VARIANTS["templates (default)"] == live.URLS
    assert "templates.repeats=false" in live.WEB_VARIANTS["templates, repeats off"]
    assert "templates.enabled=false" in live.WEB_VARIANTS["templates off"]
