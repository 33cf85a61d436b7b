"""A key-split deployment in one process, its messages delivered in an order drawn from a seed.

The proof that the protocol of ``vshard`` decides as a single worker does,
whatever the number of vshards and processes and whatever order messages
arrive in: every message is packed, and delivered from the pool of those
in flight at random (a seeded ``random.Random``), some of them twice when
``duplicates`` is set (a reader of an exchange topic may see a message
again after a restart; it keeps the first). Each epoch's slices are cut
from each vshard's input at sizes drawn from the seed too.

Given a folder (``state``), each vshard keeps its state in LMDB there and
commits it after each epoch, with the epoch's number as its metadata; and
with ``restarts`` (a chance a vshard and an epoch, at each of three
moments), vshards die and start again from their folders, drawn from the
seed: in the middle of an epoch (before a message reaches one:
it is given its slice and every message it had taken again, in order, and
must send again what it sent, byte for byte), at the end of one before its
commit (the same, and it must decide the same), and between two epochs.
A replay that differs is recorded in ``Run.differences``.

It also measures what each process would spend: the CPU time of every call
into a vshard, charged to the process holding it (vshard ``i`` to process
``i % processes``), and the bytes of every message by stage (what the
exchange topics would carry). ``bench/vshards.py`` fits and projects those.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, TypeVar

from ...config import Config
from ...core.records import Decision, Item, id_key
from ...core.signing import signing_config
from ...core.memory import collector_paused
from ..settings import DedupSettings
from .placement import homes_of, homes_of_items
from .vshard import Message, VShard, check_supported

__all__ = ["Simulator", "Run", "Forget", "cut_epochs", "homes_of_items"]

T = TypeVar("T")

_STAGES = 8  # of an epoch: a vshard takes a message from each vshard for each


@dataclass(frozen=True)
class Forget:
    """A forget order between two epochs of the input: every version of these document ids."""

    ids: tuple[str, ...]


@dataclass
class Run:
    """What a simulated run decided, in the deployment's order, and what it cost."""

    order: list[Item] = field(default_factory=list)  # the input in the order decided
    decisions: list[Decision] = field(default_factory=list)  # one per item of ``order``
    cpu: list[float] = field(default_factory=list)  # seconds of CPU per process
    stage_cpu: Counter = field(default_factory=Counter)  # seconds per stage, over all processes
    bytes: Counter = field(default_factory=Counter)  # message bytes per stage
    messages: Counter = field(default_factory=Counter)  # messages per stage
    restarts: Counter = field(default_factory=Counter)  # vshards restarted: "mid-epoch", "uncommitted", "committed"
    differences: list[str] = field(default_factory=list)  # what a restarted vshard did otherwise the second time


class Simulator:
    """``count`` vshards in ``processes`` processes (vshard i in process i % processes), in one process; their
    state in memory, or in LMDB in the folder ``state`` (one folder a vshard: ``folder``)."""

    def __init__(self, config: Config, count: int, processes: int = 1, seed: int = 0, duplicates: float = 0.0,
                 clock: Callable[[], float] = time.time, state: Optional[str] = None, sync: bool = True,
                 restarts: float = 0.0):
        check_supported(config)
        if restarts and state is None:
            raise ValueError("restarts need a state folder: a vshard in memory starts again empty")
        self.settings = DedupSettings.of(config, signing_config(config))
        self.state, self.sync = state, sync
        self.vshards = [self._opened(number, count) for number in range(count)]
        self.count, self.processes = count, processes
        self.random = random.Random(seed)
        self.duplicates = duplicates
        self.restarts = restarts
        self.clock = clock
        self.next_serial = 1
        self.next_epoch = self.vshards[0].epochs_done
        self.run = Run(cpu=[0.0] * processes)
        self._given: list[list] = [[] for _ in range(count)]  # each vshard's calls of the epoch: (call, sent)

    def folder(self, number: int) -> Optional[str]:
        """Where vshard ``number`` keeps its state (None: in memory)."""
        return None if self.state is None else os.path.join(self.state, f"vshard-{number}")

    def _opened(self, number: int, count: int) -> VShard:
        return VShard(number, count, self.settings, self.folder(number), self.sync)

    def close(self) -> None:
        """Close every vshard (an epoch not committed is thrown away)."""
        for vshard in self.vshards:
            vshard.close()

    def __enter__(self) -> "Simulator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def decide(self, epochs: Iterable) -> Run:
        """Run every epoch (a stretch of the input, in order, or a ``Forget``) to its end and commit it; what
        was decided, in order."""
        for epoch in epochs:
            number = self.next_epoch
            self._given = [[] for _ in range(self.count)]
            if isinstance(epoch, Forget):
                self._forget(number, epoch.ids)
            else:
                self._epoch(number, epoch)
            self._commit(number)
            self.next_epoch = number + 1
        return self.run

    def _commit(self, number: int) -> None:
        """Each vshard commits the epoch (some die first, and do it again); some restart after."""
        for vshard in list(self.vshards):
            if self._drawn():
                self._restarted(vshard.number, "uncommitted")
            committing = self.vshards[vshard.number]
            self._call(vshard.number, "commit", lambda: committing.commit({"epoch": number}))
            self.vshards[vshard.number].decided.pop(number)
        for vshard in list(self.vshards):
            if self._drawn():
                vshard.close()
                self.vshards[vshard.number] = self._opened(vshard.number, self.count)
                self.run.restarts["committed"] += 1

    def _drawn(self, chances: int = 1) -> bool:
        """Whether a vshard dies now, if it has ``chances`` chances in an epoch (that many messages reach it)."""
        return bool(self.restarts) and self.random.random() * chances < self.restarts

    def _restarted(self, number: int, when: str) -> list[Message]:
        """Vshard ``number`` dies and starts again from its folder, and is given again what it was given in the
        epoch: what it sends again (which must be what it sent), and the decisions it made must be made again."""
        old = self.vshards[number]
        old.close()
        new = self.vshards[number] = self._opened(number, self.count)
        sent = []
        for call, first in self._given[number]:
            again = call(new)
            if again != first:
                self.run.differences.append(f"vshard {number} restarted ({when}) sent other messages")
            sent += again
        if old.decided != new.decided:
            self.run.differences.append(f"vshard {number} restarted ({when}) decided otherwise")
        self.run.restarts[when] += 1
        return sent

    def _forget(self, number: int, ids: tuple[str, ...]) -> None:
        homes = homes_of([id_key(doc_id) for doc_id in ids], self.count).tolist() if ids else []
        flight: list[Message] = []
        for vshard in self.vshards:
            mine = [doc_id for doc_id, home in zip(ids, homes) if home == vshard.number]
            flight += self._given_to(vshard.number, "forget", lambda v, mine=mine: v.forget(number, mine))
        self._deliver(flight)

    def _epoch(self, number: int, items: list[Item]) -> None:
        now = self.clock()
        span = (self.next_serial, self.next_serial + len(items))
        homes = homes_of_items(items, self.count).tolist()
        flight: list[Message] = []
        for vshard in self.vshards:
            mine = [at for at, home in enumerate(homes) if home == vshard.number]
            slice_items, serials = [items[at] for at in mine], [span[0] + at for at in mine]
            flight += self._given_to(vshard.number, "slice",
                                     lambda v, given=(slice_items, serials): v.slice(number, *given, span, now))
        self._deliver(flight)
        decided = [iter(vshard.decided[number]) for vshard in self.vshards]
        self.run.order += items
        self.run.decisions += [next(decided[home]) for home in homes]
        self.next_serial = span[1]

    def _deliver(self, flight: list[Message]) -> None:
        """Deliver the messages in flight and those they set off, in an order drawn from the seed."""
        while flight:
            at = self.random.randrange(len(flight))
            message = flight[at]
            if self.random.random() >= self.duplicates:
                flight[at] = flight[-1]
                flight.pop()
            self.run.bytes[message.stage] += len(message.body)
            self.run.messages[message.stage] += 1
            if self._drawn(self.count * _STAGES):
                flight += self._restarted(message.to, "mid-epoch")  # copies of what it sent: dropped on arrival
            flight += self._given_to(message.to, message.stage, lambda v, message=message: v.receive(message))

    def _given_to(self, number: int, stage: str, call: Callable[[VShard], list[Message]]) -> list[Message]:
        """``call`` made on vshard ``number`` (and remembered with what it sent, if vshards restart)."""
        vshard = self.vshards[number]
        sent = self._call(number, stage, lambda: call(vshard))
        if self.restarts:
            self._given[number].append((call, sent))
        return sent

    def _call(self, vshard: int, stage: str, work: Callable[[], T]) -> T:
        """Run ``work`` on ``vshard``'s behalf, charged to its process. The cycle collector is off meanwhile:
        it would walk every vshard's objects (one heap here, one per process in a deployment) in whichever
        call it fell on."""
        with collector_paused():
            begin = time.process_time()
            sent = work()
            spent = time.process_time() - begin
        self.run.cpu[vshard % self.processes] += spent
        self.run.stage_cpu[stage] += spent
        return sent


def cut_epochs(partitions: list[list[Item]], seed: int, largest: int = 64) -> list[list[Item]]:
    """The input partitions cut into epochs: each takes from each partition in turn a stretch of a size drawn
    from ``seed`` (0 to ``largest``), in order."""
    draw = random.Random(seed)
    at = [0] * len(partitions)
    epochs = []
    while any(at[p] < len(partition) for p, partition in enumerate(partitions)):
        epoch = []
        for p, partition in enumerate(partitions):
            size = draw.randint(0, largest)
            epoch += partition[at[p]:at[p] + size]
            at[p] += size
        epochs.append(epoch)
    return epochs
