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
from ..settings import DedupSettings
from .placement import homes_of
from .vshard import Message, VShard, check_supported

__all__ = ["Simulator", "Run", "cut_epochs"]


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
        self.run = Run(cpu=[0.0] * processes)

    def decide(self, epochs: Iterable[list[list[Item]]]) -> Run:
        """Run every epoch (for each, one slice per vshard) to its end; what was decided, in order."""
        for number, slices in enumerate(epochs):
            self._epoch(number, slices)
        return self.run

    def _epoch(self, number: int, slices: list[list[Item]]) -> None:
        now = self.clock()
        flight: list[Message] = []
        for vshard, items in zip(self.vshards, slices):
            flight += self._call(vshard.number, "slice", lambda: vshard.slice(number, items, now))
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
        for vshard, items in zip(self.vshards, slices):
            self.run.order += items
            self.run.decisions += vshard.decided.pop(number)

    def _call(self, vshard: int, stage: str, work: Callable[[], list[Message]]) -> list[Message]:
        begin = time.process_time()
        sent = work()
        spent = time.process_time() - begin
        self.run.cpu[vshard % self.processes] += spent
        self.run.stage_cpu[stage] += spent
        return sent


def cut_epochs(items: list[Item], count: int, seed: int, largest: int = 64) -> list[list[list[Item]]]:
    """``items`` (one input partition's order) cut into epochs: each vshard's input is the items whose ids it
    is home to, in order, and each epoch takes a number of each drawn from ``seed`` (0 to ``largest``)."""
    homes = homes_of([id_key(item.id) if item.id is not None else b"\0" * 8 for item in items], count).tolist()
    queues: list[list[Item]] = [[] for _ in range(count)]
    for item, home in zip(items, homes):
        queues[home].append(item)
    draw = random.Random(seed)
    at = [0] * count
    epochs = []
    while any(at[v] < len(queues[v]) for v in range(count)):
        sizes = [draw.randint(0, largest) for _ in range(count)]
        epochs.append([queues[v][at[v]:at[v] + sizes[v]] for v in range(count)])
        at = [at[v] + sizes[v] for v in range(count)]
    return epochs
