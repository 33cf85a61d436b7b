"""The one reconnect loop of every role: sessions until one ends, a lost broker waited out with backoff.

A role (the worker, a shard, a signing process) connects and recovers in a
session, then works in it until it is done or stopped. Whatever the Kafka
client raises goes through ``errors.kafka_trouble``: transient trouble ends
the session, which is thrown away, and after a pause that doubles up to 30 s
a new one starts (``broker_lost`` / ``broker_back`` in the log); anything
else stops the role. A session whose commit its consumer group refused
(``GroupMovedError``: the group moved its partitions; the broker answers) is
followed by the next at once (``fenced_by_group``), unless the one before it
was refused so too without committing anything. A ``Watchdog`` says in the
log what a step that talks to Kafka waits for when it takes long, and
``/healthz`` fails once it has waited ``worker.stall_timeout_s``.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, TypeVar

from ..config import Config
from ..errors import BrokerError, GroupMovedError, StreamdedupError, kafka_trouble
from ..ops.logs import Log
from ..ops.summary import Summary
from ..ops.telemetry import WorkerTelemetry

__all__ = ["Stopper", "Watchdog", "SessionLoop", "WorkerStats", "close_quietly", "BACKOFF_FIRST_S", "BACKOFF_MAX_S"]

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
T = TypeVar("T")


class Stopper:
    """Set by SIGTERM / SIGINT (or a test); the loop stops between batches."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.event.set())

    @property
    def stopped(self) -> bool:
        return self.event.is_set()

    def wait(self, seconds: float) -> bool:
        return self.event.wait(seconds)


@dataclass
class WorkerStats:
    """What a role's sessions did: the worker's, or a vshards process's outcomes."""

    summary: Summary = field(default_factory=Summary)
    batches: int = 0
    last_commit: float = 0.0
    lag: dict = field(default_factory=dict)
    caught_up: bool = False


def close_quietly(*parts) -> None:
    """Close a session's parts (None: never made); closing after the broker vanished may fail, and nothing
    is pending then."""
    for part in parts:
        if part is not None:
            try:
                part.close()
            except Exception:
                pass


class Watchdog:
    """Says in the log what the worker waits for when a step that talks to Kafka takes too long.

    The Kafka client retries a lost broker by itself (with exponential
    reconnect backoff); without this, the worker would just fall silent.
    """

    def __init__(self, log: Log, bootstrap: str, patience_s: float = 5.0,
                 on_wait: Callable[[Optional[str]], None] = lambda waiting_for: None):
        self.log = log
        self.on_wait = on_wait
        self.bootstrap = bootstrap
        self.patience_s = patience_s
        self._lock = threading.Lock()
        self._phase: Optional[str] = None
        self._since = 0.0
        self._reported = 0.0
        self.waiting = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self._thread.start()

    def phase(self, name: Optional[str], back: bool = True) -> None:
        """Enter a step (``None``: idle in our own code); ``back=False``: the step failed, the broker is not back."""
        with self._lock:
            if self.waiting:
                if back:
                    self.log.info("broker_back", after=self._phase,
                                  waited_s=round(time.monotonic() - self._since, 1))
                self.waiting = False
                self.on_wait(None)
            self._phase, self._since, self._reported = name, time.monotonic(), 0.0

    def current(self) -> tuple[Optional[str], float]:
        """The step the worker is in (None: idle in our own code) and how long it has been in it."""
        with self._lock:
            return self._phase, time.monotonic() - self._since

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                if self._phase is None:
                    continue
                waited = time.monotonic() - self._since
                if waited >= self.patience_s and waited - self._reported >= min(max(self._reported, 5.0), 30.0):
                    self.waiting = True
                    self.on_wait(self._phase)
                    self._reported = waited
                    self.log.warning("broker_lost", waiting_for=self._phase, waited_s=round(waited, 1),
                                     bootstrap=self.bootstrap)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


class SessionLoop:
    """Runs a role's sessions until one returns or the role is stopped, reconnecting with backoff."""

    def __init__(self, config: Config, log: Log, stopper: Stopper, telemetry: WorkerTelemetry, **fields):
        """``fields``: added to every line this loop logs (``role="sign"``)."""
        self.config = config
        self.log = log
        self.stopper = stopper
        self.telemetry = telemetry
        self.fields = fields
        self.watchdog = Watchdog(log, config.kafka.bootstrap_servers, on_wait=self._waiting_for)
        telemetry.current_step = self.watchdog.current
        telemetry.stall_timeout_s = config.worker.stall_timeout_s

    def _waiting_for(self, phase: Optional[str]) -> None:
        self.telemetry.waiting_for = phase

    def run(self, session: Callable[[Callable[..., None]], T], until_done: bool = False,
            explain: Callable[[BaseException], Optional[StreamdedupError]] = lambda exc: None) -> Optional[T]:
        """``session(connected)`` again and again until it returns (its result) or the role is stopped (None).

        A session calls ``connected(**fields)`` once it is up and recovered
        (logged as ``assigned``, or ``broker_back`` after a loss); it closes
        what it opened before it ends, raising or not. ``explain`` names a
        missing right in an error, before ``kafka_trouble`` sorts it.
        ``until_done``: the role should finish (``--until-caught-up``), so
        it gives up on a broker that stays away (``_give_up_if_unreachable``).
        """
        delay = BACKOFF_FIRST_S
        regrouped = False  # the last session was refused by its group (``GroupMovedError``)
        lost = False
        lost_since = 0.0  # when the broker went away (0: it answers)
        attempt_began: Optional[float] = None

        def connected(**fields) -> None:
            nonlocal lost, delay, lost_since, attempt_began
            self.watchdog.phase(None)
            self.telemetry.assigned, self.telemetry.waiting_for = True, None
            self.log.info("broker_back" if lost else "assigned", **self.fields, **fields)
            lost, delay, lost_since = False, BACKOFF_FIRST_S, 0.0
            attempt_began = None  # from here a failure starts the count when it happens

        while not self.stopper.stopped:
            attempt_began = time.monotonic()
            try:
                self.watchdog.phase("connecting and recovering")
                return session(connected)
            except Exception as exc:
                trouble = explain(exc) or kafka_trouble(exc)
                if trouble is None or not trouble.retriable:
                    raise trouble or exc
                self.watchdog.phase(None, back=False)
                if isinstance(trouble, GroupMovedError):
                    at_once = not regrouped or trouble.session_committed  # a second in a row waits: no spinning
                    regrouped = True
                    self._log_regrouped(trouble, "a new session starts at once" if at_once else
                                        f"a new session starts in {delay:g} s: the group moved again before this "
                                        "process committed anything")
                    if not at_once:
                        self.stopper.wait(delay)
                        delay = min(delay * 2, BACKOFF_MAX_S)
                    continue
                regrouped = False
                lost_since = lost_since or attempt_began or time.monotonic()
                self._give_up_if_unreachable(trouble, lost_since, until_done)
                lost = True
                self.telemetry.assigned, self.telemetry.waiting_for = False, "the broker to answer"
                self.log.warning("broker_lost", **self.fields, error=str(trouble)[:300], retry_in_s=delay,
                                 waiting_for="the broker to answer", bootstrap=self.config.kafka.bootstrap_servers)
                self.stopper.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
        return None

    def _log_regrouped(self, trouble: GroupMovedError, then: str) -> None:
        """A session refused by its consumer group: not a lost broker (it answered), so not ``broker_lost``."""
        self.telemetry.assigned = False
        self.log.warning("fenced_by_group", **self.fields, error=str(trouble)[:300], then=then)

    def _give_up_if_unreachable(self, trouble: BaseException, lost_since: float, until_done: bool) -> None:
        """With ``--until-caught-up``, stop once the broker has not answered for ``worker.unreachable_timeout_s``.

        A run that must finish (a cron job, a test) should not wait forever
        for a broker that is gone; the long-lived worker waits as long as it
        takes (it logs what it waits for). 0 waits forever in both.
        """
        limit = self.config.worker.unreachable_timeout_s
        waited = time.monotonic() - lost_since
        if until_done and limit and waited >= limit:
            raise BrokerError(f"no broker answered for {waited:.0f} s (worker.unreachable_timeout_s = {limit:g}) "
                              f"at {self.config.kafka.bootstrap_servers}; last error: {trouble}. Check that the "
                              "broker runs and kafka.bootstrap_servers points at it, or raise "
                              "worker.unreachable_timeout_s (0: wait forever)")

    def close(self) -> None:
        self.watchdog.close()
