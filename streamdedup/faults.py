"""Test-only switches that stop, pause or fail the process at a named step of a commit protocol.

Random kills rarely land in the narrow windows between two steps, so the
crash tests name the step instead. Each switch is an environment variable
holding ``step`` or ``step:N`` (the N-th time the step is reached); several
may be given, separated by commas. Unset, every check is one dictionary
lookup.

- ``STREAMDEDUP_TEST_CRASH_AT``: exit at once with code 137, like kill -9.
- ``STREAMDEDUP_TEST_PAUSE_AT``: create the file ``$STREAMDEDUP_TEST_PAUSE_FILE``
  and wait until the test deletes it (to stop the broker in the middle of a
  batch, say).
- ``STREAMDEDUP_TEST_FAIL_AT``: make ``failing(step)`` true there (an index
  commit that fills the map, say).
"""

from __future__ import annotations

import os
import time

__all__ = ["reached", "crash_point", "pause_point", "failing", "CRASH_ENV", "PAUSE_ENV", "PAUSE_FILE_ENV", "FAIL_ENV"]

CRASH_ENV = "STREAMDEDUP_TEST_CRASH_AT"
PAUSE_ENV = "STREAMDEDUP_TEST_PAUSE_AT"
PAUSE_FILE_ENV = "STREAMDEDUP_TEST_PAUSE_FILE"
FAIL_ENV = "STREAMDEDUP_TEST_FAIL_AT"
_reached: dict[tuple[str, str], int] = {}  # (switch, step) -> times reached


def _due(env: str, step: str) -> bool:
    """Whether the switch ``env`` names this step, this time it is reached."""
    wanted = os.environ.get(env)
    if not wanted:
        return False
    nths = [int(nth or 1) for name, _, nth in (w.partition(":") for w in wanted.split(",")) if name == step]
    if not nths:
        return False
    times = _reached[(env, step)] = _reached.get((env, step), 0) + 1
    return times in nths


def crash_point(step: str) -> None:
    """Die at once, like kill -9, when the crash switch names this step."""
    if _due(CRASH_ENV, step):
        os._exit(137)


def pause_point(step: str) -> None:
    """Wait here while the pause file exists, when the pause switch names this step."""
    if not _due(PAUSE_ENV, step):
        return
    path = os.environ[PAUSE_FILE_ENV]
    with open(path + ".tmp", "w") as handle:
        handle.write(step)
    os.replace(path + ".tmp", path)  # whole or absent: a test that sees the file reads the step in it
    while os.path.exists(path):
        time.sleep(0.05)


def failing(step: str) -> bool:
    """Whether the fail switch names this step now."""
    return _due(FAIL_ENV, step)


def reached(step: str) -> None:
    """A commit step is done: crash or pause here if a switch says so."""
    crash_point(step)
    pause_point(step)
