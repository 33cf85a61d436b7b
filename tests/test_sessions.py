"""The session loop: a session refused by its consumer group starts again at once, not after a lost broker's
backoff, unless the one before it was refused so too without committing anything."""

from __future__ import annotations

import io
import json

from streamdedup import config as config_module
from streamdedup.errors import BrokerUnavailableError, GroupMovedError
from streamdedup.ops.logs import Log
from streamdedup.ops.telemetry import WorkerTelemetry
from streamdedup.runtime import sessions
from streamdedup.runtime.sessions import SessionLoop, Stopper


def refused(committed: bool) -> GroupMovedError:
    error = GroupMovedError("refused for an old generation of the group")
    error.session_committed = committed
    return error


def test_a_session_refused_by_its_group_starts_again_at_once_and_a_second_refusal_in_a_row_waits(monkeypatch):
    monkeypatch.setattr(sessions, "BACKOFF_FIRST_S", 0.01)
    ends = [refused(False), refused(True), refused(False), BrokerUnavailableError("the broker went away"),
            refused(False), refused(False)]
    stream = io.StringIO()
    loop = SessionLoop(config_module.load(None, (), environ={}), Log(fmt="json", level="debug", stream=stream),
                       Stopper(), WorkerTelemetry(None, None), role="vshards")

    def session(connected):
        connected()
        if ends:
            raise ends.pop(0)
        return "done"

    try:
        assert loop.run(session) == "done"
    finally:
        loop.close()
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    ended = [(e["event"], e.get("then", "").split(":")[0]) for e in events if e["event"] != "assigned"]
    at_once, waits = "a new session starts at once", "a new session starts in 0.01 s"
    assert ended == [("fenced_by_group", at_once),  # the first refusal
                     ("fenced_by_group", at_once),  # again, but the session had committed epochs before
                     ("fenced_by_group", waits),  # again, nothing committed since the one before
                     ("broker_lost", ""),
                     ("broker_back", ""),
                     ("fenced_by_group", at_once),  # the first refusal since the broker came back
                     ("fenced_by_group", waits)]
    assert all(e["role"] == "vshards" for e in events)
