"""The benchmarks' shared harness (``bench/harness.py``): rounds taken in turn, medians, paired ratios."""

from __future__ import annotations

from bench import harness


def test_rounds_take_every_contender_in_turn_and_alternate_when_asked():
    seen = []
    values = harness.interleaved(["a", "b", "c"], 3, lambda name, number: seen.append((number, name)) or 1.0,
                                 alternate=True, log=None)
    assert seen == [(0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"), (2, "a"), (2, "b"), (2, "c")]
    assert values == {"a": [1.0] * 3, "b": [1.0] * 3, "c": [1.0] * 3}


def test_the_table_gives_medians_min_max_and_both_ratios():
    rates = {"ours": [100.0, 300.0, 200.0], "peer": [50.0, 100.0, 200.0]}
    table = harness.table(rates, "peer", columns={"notes": {"ours": "on disk"}}).splitlines()
    assert table[0] == "| contender | median docs/s | min-max | vs peer (paired) | notes |"
    assert table[2] == "| ours | 200 | 100-300 | 2.00x (2.00x) | on disk |"  # paired: median of 2, 3, 1
    assert table[3] == "| peer | 100 | 50-200 |  |  |"
    lower = harness.table(rates, "ours", ratio="ours / it (paired)", higher_is_better=False).splitlines()
    assert lower[3] == "| peer | 100 | 50-200 | 2.00x (2.00x) |"


def test_the_dedup_summary_rate_is_read_from_its_own_line():
    summary = "documents       1,190   (9,990 docs/s in 0.1 s)\nkept              839\n"
    assert harness.summary_rate(summary) == 9990.0
    assert harness.dedup_command("in.jsonl", "s", ["lsh.threshold=0.8", "--learn-first"], "d.jsonl")[3:] == [
        "dedup", "in.jsonl", "--state", "s", "--decisions", "d.jsonl", "--set", "lsh.threshold=0.8", "--learn-first"]


def test_the_offline_benchs_index_is_deleted_after_the_clock_not_within_it(tmp_path, monkeypatch):
    """``bench.offline``: our end-to-end run leaves its index folder (a user keeps it) to ``after_clock``, which
    deletes it once the task's clock stopped, as the peers' in-memory indexes are freed then."""
    import json
    import tempfile

    from bench import offline

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = tmp_path / "crawl.jsonl"
    lines = [(json.dumps({"id": f"d{i}", "text": f"the same words again and again, page {i % 7}"}) + "\n").encode()
             for i in range(40)]
    result = offline.ours_one_process(offline.JsonlFile(lines, str(path)))
    left = [p for p in tmp_path.iterdir() if p.name.startswith("bench-index-")]
    assert result["kept"] >= 1 and len(left) == 1 and (left[0] / "state").is_dir()
    offline._clear_after_clock()
    assert not left[0].exists() and offline.AFTER_CLOCK == []
