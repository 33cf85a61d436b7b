"""The process's memory: the cycle collector run at a loop's quiet points (``core.memory.QuietCollector``)."""

from __future__ import annotations

import gc
import weakref

from streamdedup.core.memory import QuietCollector, collector_paused


class _Node:
    pass


def _cycle() -> weakref.ref:
    """A pair of objects referring to each other, dropped: only the cycle collector frees them."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_a_paused_loop_collects_its_cycles_after_a_finished_turn_or_a_long_wait():
    now = [0.0]
    collector = QuietCollector(every_s=10.0, clock=lambda: now[0])
    with collector_paused():
        assert not gc.isenabled()
        gone = _cycle()
        assert collector.now_and_then(False) == -1 and gone() is not None  # nothing finished, no time gone by
        assert collector.now_and_then(True) == 0 and gone() is None
        gone = _cycle()
        now[0] = 9.9
        assert collector.now_and_then(False) == -1 and gone() is not None
        now[0] = 10.0
        assert collector.now_and_then(False) == 0 and gone() is None
    assert gc.isenabled()


def test_every_tenth_pass_takes_the_next_generation_and_every_hundredth_all_three():
    collector = QuietCollector(clock=lambda: 0.0)
    generations = [collector.now_and_then(True) for _ in range(200)]
    assert generations.count(2) == 2 and generations[99] == generations[199] == 2
    assert generations.count(1) == 18 and generations[9] == 1 and generations[109] == 1
    assert generations.count(0) == 180
