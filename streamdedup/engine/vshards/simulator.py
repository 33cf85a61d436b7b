"""A key-split deployment in one process, its messages delivered in an order drawn from a seed.

The proof that the protocol of ``vshard`` decides as a single worker does,
whatever the number of vshards and processes and whatever order messages
arrive in: every message is packed, and delivered from the pool of those
in flight at random (a seeded ``random.Random``), some of them twice when
``duplicates`` is set (a reader of an exchange topic may see a message
again after a restart; it keeps the first). Each epoch's slices are cut
from each vshard's input at sizes drawn from the seed too.

It also measures what each process would spend: the CPU time of every call
into a vshard, charged to the process holding it (vshard ``i`` to process
``i % processes``), and the bytes of every message by stage (what the
exchange topics would carry). ``bench/vshards.py`` fits and projects those.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ...config import Config
from ...core.records import Decision, Item, id_key
from ...core.signing import signing_config
from ..engine import collector_paused
from ..settings import DedupSettings
from .placement import homes_of
from .vshard import Message, VShard, check_supported

__all__ = ["Simulator", "Run", "Forget", "cut_epochs", "homes_of_items"]


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


class Simulator:
    """``count`` vshards in ``processes`` processes (vshard i in process i % processes), in one process."""

    def __init__(self, config: Config, count: int, processes: int = 1, seed: int = 0, duplicates: float = 0.0,
                 clock: Callable[[], float] = time.time):
        check_supported(config)
        settings = DedupSettings.of(config, signing_config(config))
        self.vshards = [VShard(number, count, settings) for number in range(count)]
        self.count, self.processes = count, processes
        self.random = random.Random(seed)
        self.duplicates = duplicates
        self.clock = clock
        self.next_serial = 1
        self.run = Run(cpu=[0.0] * processes)

    def decide(self, epochs: Iterable) -> Run:
        """Run every epoch (a stretch of the input, in order, or a ``Forget``) to its end; what was decided,
        in order."""
        for number, epoch in enumerate(epochs):
            if isinstance(epoch, Forget):
                self._forget(number, epoch.ids)
            else:
                self._epoch(number, epoch)
        return self.run

    def _forget(self, number: int, ids: tuple[str, ...]) -> None:
        homes = homes_of([id_key(doc_id) for doc_id in ids], self.count).tolist() if ids else []
        flight: list[Message] = []
        for vshard in self.vshards:
            mine = [doc_id for doc_id, home in zip(ids, homes) if home == vshard.number]
            flight += self._call(vshard.number, "forget", lambda: vshard.forget(number, mine))
        self._deliver(flight)
        for vshard in self.vshards:
            vshard.decided.pop(number)

    def _epoch(self, number: int, items: list[Item]) -> None:
        now = self.clock()
        span = (self.next_serial, self.next_serial + len(items))
        homes = homes_of_items(items, self.count)
        flight: list[Message] = []
        for vshard in self.vshards:
            mine = [at for at, home in enumerate(homes) if home == vshard.number]
            slice_items, serials = [items[at] for at in mine], [span[0] + at for at in mine]
            flight += self._call(vshard.number, "slice", lambda: vshard.slice(number, slice_items, serials, span, now))
        self._deliver(flight)
        decided = [iter(vshard.decided.pop(number)) for vshard in self.vshards]
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
            target = self.vshards[message.to]
            flight += self._call(target.number, message.stage, lambda: target.receive(message))

    def _call(self, vshard: int, stage: str, work: Callable[[], list[Message]]) -> list[Message]:
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


def homes_of_items(items: list[Item], count: int) -> list[int]:
    """The home of each record: its document id's (a record without an id: the place it came from)."""
    keys = [id_key(item.id if item.id is not None else f"{item.source.name}:{item.source.partition}:"
                                                       f"{item.source.offset}") for item in items]
    return homes_of(keys, count).tolist()


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
