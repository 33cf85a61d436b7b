"""The progress bar: rate and ETA on a terminal, silence elsewhere."""

from __future__ import annotations

import io

from streamdedup.ops.progress import Progress, format_duration


def test_progress_draws_rate_fraction_and_eta_when_enabled():
    out = io.StringIO()
    progress = Progress(total=1000, label="docs", stream=out, enabled=True)
    progress.started -= 2.0  # two seconds ago
    progress.update(250, 250)
    progress.close()
    text = out.getvalue()
    assert "25.0%" in text and "250 docs" in text and "docs/s" in text and "ETA 0:0" in text
    assert text.endswith("\n")


def test_progress_is_silent_when_stderr_is_not_a_terminal():
    out = io.StringIO()  # isatty() is False
    progress = Progress(total=10, stream=out)
    progress.update(5, 5)
    progress.close()
    assert out.getvalue() == ""


def test_durations():
    assert format_duration(59) == "0:59"
    assert format_duration(3600 + 61) == "1:01:01"
