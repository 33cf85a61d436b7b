"""The worker's start-up decision (``checkpoint.start_plan``), case by case, without a broker."""

from __future__ import annotations

import pytest
from kafka import TopicPartition

from streamdedup.errors import IndexUnusableError
from streamdedup.runtime.checkpoint import StartPlan, start_plan

A, B, C, D = (TopicPartition("raw", n) for n in range(4))
GROUP = "dedup-group"


def plan(stored, committed, beginnings=None, has_sink=True) -> StartPlan:
    return start_plan(stored, committed, beginnings or dict.fromkeys(stored, 0), has_sink, GROUP)


@pytest.mark.parametrize("has_sink", [True, False])
def test_a_partition_the_index_never_read_starts_at_its_beginning_and_is_recorded(has_sink):
    got = plan({A: None}, {}, {A: 120}, has_sink)  # 120: the topic's retention dropped the first records
    assert got == StartPlan(fresh={A: 120}, gaps={}, starts={A: 120}, warnings=[])


def test_a_group_offset_on_a_partition_the_index_never_read_is_refused():
    with pytest.raises(IndexUnusableError) as refused:
        plan({A: 10, B: None}, {A: 10, B: 7})
    message = str(refused.value)
    assert f"consumer group {GROUP!r} has committed offset 7 on raw/1" in message
    assert "another index was used with this group" in message and "set kafka.group_id to a new group" in message


def test_a_batch_kafka_committed_but_the_index_did_not_is_a_gap_replayed_from_the_index_position():
    assert plan({A: 400}, {A: 600}) == StartPlan(fresh={}, gaps={A: (400, 600)}, starts={A: 600}, warnings=[])


def test_index_and_group_agreeing_start_there_silently():
    assert plan({A: 400}, {A: 400}) == StartPlan(fresh={}, gaps={}, starts={A: 400}, warnings=[])


def test_a_group_behind_the_index_is_a_warning_and_the_index_wins():
    assert plan({A: 400}, {A: 250}) == StartPlan(
        fresh={}, gaps={}, starts={A: 400},
        warnings=[("group_offset_behind", {"partition": "raw/0", "group": 250, "index": 400})])


def test_a_missing_group_offset_is_a_warning_only_when_outcomes_are_emitted():
    with_sink = plan({A: 400}, {A: None})
    assert with_sink.starts == {A: 400} and not with_sink.gaps and not with_sink.fresh
    assert with_sink.warnings == [("group_offset_missing", {"partition": "raw/0", "index_position": 400})]
    assert plan({A: 400}, {}, has_sink=False) == StartPlan(fresh={}, gaps={}, starts={A: 400}, warnings=[])


def test_each_partition_is_decided_on_its_own_in_the_given_order():
    got = plan({D: 50, A: None, C: 300, B: 90}, {D: 40, C: 310, B: 90}, {A: 5, B: 0, C: 0, D: 0})
    assert list(got.starts) == [D, A, C, B]
    assert got == StartPlan(fresh={A: 5}, gaps={C: (300, 310)}, starts={D: 50, A: 5, C: 310, B: 90},
                            warnings=[("group_offset_behind", {"partition": "raw/3", "group": 40, "index": 50})])
