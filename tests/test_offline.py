"""The offline command: outputs, persistence, bad input, and crash recovery (kill -9)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import index_snapshot, read_jsonl, run_cli

from streamdedup.core import corpus

DECISION_KEYS = {"id", "status", "cluster", "matched", "similarity", "reason", "relation", "containment"}


def dedup(tmp, inputs, state="state", out="clean.jsonl", decisions="decisions.jsonl", extra=(), **kw):
    args = ["dedup", *map(str, inputs), "--state", str(tmp / state)]
    if out:
        args += ["--out", str(tmp / out)]
    if decisions:
        args += ["--decisions", str(tmp / decisions)]
    return run_cli(*args, *extra, **kw)


@pytest.mark.system
def test_decisions_line_up_with_input_and_clean_holds_kept_lines_byte_for_byte(tmp_path, crawl_file):
    result = dedup(tmp_path, [crawl_file])
    lines = crawl_file.read_bytes().splitlines(keepends=True)
    decisions = read_jsonl(tmp_path / "decisions.jsonl")
    assert len(decisions) == len(lines)
    assert all(set(d) == DECISION_KEYS for d in decisions)
    assert [d["id"] for d in decisions] == [json.loads(line)["id"] for line in lines]
    kept = [line for line, d in zip(lines, decisions) if d["status"] == "kept"]
    assert (tmp_path / "clean.jsonl").read_bytes() == b"".join(kept)
    statuses = {d["status"] for d in decisions}
    assert statuses == {"kept", "duplicate"}
    assert b"documents" in result.stdout and b"kept" in result.stdout


@pytest.mark.system
def test_stdin_and_stdout(tmp_path, crawl_file):
    data = crawl_file.read_bytes()
    result = run_cli("dedup", "-", "--state", str(tmp_path / "s"), "--decisions", "-", stdin=data)
    decisions = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(decisions) == data.count(b"\n")
    assert b"kept" in result.stderr  # the summary goes to stderr when decisions use stdout


@pytest.mark.system
def test_outputs_may_be_dev_null_or_a_named_pipe(tmp_path, crawl_file):
    """Files that cannot be cut back (a device, a pipe) are written as they come, also on a second run."""
    pipe = tmp_path / "clean.fifo"
    os.mkfifo(pipe)
    with open(tmp_path / "read", "wb") as sink:
        reader = subprocess.Popen(["cat", str(pipe)], stdout=sink)
        result = run_cli("dedup", str(crawl_file), "--state", str(tmp_path / "s"), "--out", str(pipe),
                         "--decisions", os.devnull)
        reader.wait(timeout=60)
    clean = (tmp_path / "read").read_bytes()
    kept = int(re.search(rb"kept\s+([\d,]+)", result.stdout + result.stderr).group(1).replace(b",", b""))
    assert kept > 0 and clean.count(b"\n") == kept
    again = run_cli("dedup", str(crawl_file), "--state", str(tmp_path / "s"), "--out", os.devnull)
    assert again.returncode == 0


@pytest.mark.system
def test_a_second_run_deduplicates_against_everything_seen_before(tmp_path):
    docs = corpus.generate(60, seed=5)
    first, copies = tmp_path / "first.jsonl", tmp_path / "copies.jsonl"
    with open(first, "w") as handle:
        corpus.write_jsonl(docs, handle)
    with open(copies, "w") as handle:
        for d in docs:
            handle.write(json.dumps({"id": "copy-" + d.id, "text": d.text.upper() + " extra words"}) + "\n")
    dedup(tmp_path, [first])
    dedup(tmp_path, [copies], out="clean2.jsonl", decisions="decisions2.jsonl")
    again = read_jsonl(tmp_path / "decisions2.jsonl")
    before = {d["id"]: d for d in read_jsonl(tmp_path / "decisions.jsonl")}
    # a copy of an excerpt is compared with kept documents only, and may fall just short of containing enough
    again = [d for d in again if before[d["id"][len("copy-"):]]["relation"] != "excerpt"]
    assert len(again) >= 50 and all(d["status"] == "duplicate" for d in again)
    assert (tmp_path / "clean2.jsonl").read_bytes().count(b"\n") == sum(
        d["status"] == "kept" for d in read_jsonl(tmp_path / "decisions2.jsonl"))
    family = {d.id: d.family for d in docs}
    first_clusters = {d["cluster"] for d in before.values()}
    for d in again:
        assert d["cluster"] in first_clusters
        assert family[d["cluster"]] == family[d["id"][len("copy-"):]]


BAD_LINES = [
    (b'{"id": "ok1", "text": "a perfectly fine document with several words in it"}', "kept"),
    (b"{broken json", "invalid_json"),
    (b"", "invalid_json"),
    (b"[1, 2, 3]", "not_an_object"),
    (b'{"id": "m"}', "missing_text"),
    (b'{"id": "n", "text": 7}', "text_not_string"),
    (b'{"id": "i", "text": "caf\xe9 latin-1"}', "invalid_utf8"),
    (b'{"id": "e", "text": "  ...  !!! "}', "empty_text"),
    (b'{"id": "h", "text": "' + b"x" * 3000 + b'"}', "text_too_large"),
    (b'{"id": "ok2", "text": "another fine document, unrelated to the first one at all"}', "kept"),
]


@pytest.mark.system
def test_every_malformed_line_is_rejected_with_its_reason_and_the_run_continues(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(line for line, _ in BAD_LINES) + b"\n")
    result = dedup(tmp_path, [path], extra=["--set", "input.max_text_bytes=2000"])
    decisions = read_jsonl(tmp_path / "decisions.jsonl")
    assert len(decisions) == len(BAD_LINES)
    for d, (_, expected) in zip(decisions, BAD_LINES):
        if expected == "kept":
            assert d["status"] == "kept"
        else:
            assert d["status"] == "rejected" and d["reason"].split(":")[0] == expected, d
    assert decisions[1]["id"] == f"{path}:2"  # no id to be had: the file and line name it
    assert b"rejected            8" in result.stdout


def _uninterrupted(tmp_path, crawl_file):
    base = tmp_path / "reference"
    base.mkdir()
    dedup(base, [crawl_file], extra=["--set", "worker.batch_size=100"])
    return base


def _same_outcome(run_dir, reference):
    for name in ("clean.jsonl", "decisions.jsonl"):
        assert (run_dir / name).read_bytes() == (reference / name).read_bytes(), name
    assert index_snapshot(run_dir / "state") == index_snapshot(reference / "state")
    assert run_cli("check", "--state", str(run_dir / "state")).returncode == 0


@pytest.mark.system
@pytest.mark.parametrize("step", ["file-decided", "file-written", "file-committed"])
def test_killed_at_each_commit_step_then_restarted_ends_as_an_uninterrupted_run(tmp_path, crawl_file, step):
    reference = _uninterrupted(tmp_path, crawl_file)
    run_dir = tmp_path / "crashed"
    run_dir.mkdir()
    crashed = dedup(run_dir, [crawl_file], extra=["--set", "worker.batch_size=100"], check=False,
                    env={"STREAMDEDUP_TEST_CRASH_AT": f"{step}:4"})
    assert crashed.returncode == 137
    decided_before = len((run_dir / "decisions.jsonl").read_bytes().splitlines())
    assert 0 < decided_before < 1190
    resumed = dedup(run_dir, [crawl_file], extra=["--set", "worker.batch_size=100"])
    assert b"resumed" in resumed.stdout
    _same_outcome(run_dir, reference)


@pytest.mark.system
def test_random_kill_9_many_times_loses_and_repeats_nothing(tmp_path):
    docs = corpus.generate(4000, seed=11)
    source = tmp_path / "big.jsonl"
    with open(source, "w") as handle:
        corpus.write_jsonl(docs, handle)
    reference = tmp_path / "reference"
    reference.mkdir()
    dedup(reference, [source], extra=["--set", "worker.batch_size=50"])
    run_dir = tmp_path / "killed"
    run_dir.mkdir()
    rng = random.Random(3)
    args = [sys.executable, "-m", "streamdedup", "dedup", str(source), "--state", str(run_dir / "state"),
            "--out", str(run_dir / "clean.jsonl"), "--decisions", str(run_dir / "decisions.jsonl"),
            "--set", "worker.batch_size=50"]
    decisions = run_dir / "decisions.jsonl"
    kills = 0
    for _ in range(60):  # killed a moment after each run made progress, until one finishes
        before = decisions.stat().st_size if decisions.exists() else 0
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while process.poll() is None and (decisions.stat().st_size if decisions.exists() else 0) <= before:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.15))
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            kills += 1
        if process.wait() == 0:
            break
    assert kills >= 3
    subprocess.run(args, check=True, capture_output=True)
    _same_outcome(run_dir, reference)


@pytest.mark.system
def test_running_the_same_command_again_gives_the_same_outputs(tmp_path, crawl_file):
    dedup(tmp_path, [crawl_file])
    before = {n: (tmp_path / n).read_bytes() for n in ("clean.jsonl", "decisions.jsonl")}
    snapshot = index_snapshot(tmp_path / "state")
    again = dedup(tmp_path, [crawl_file])
    assert b"replayed" in again.stdout
    assert {n: (tmp_path / n).read_bytes() for n in before} == before
    assert index_snapshot(tmp_path / "state") == snapshot


@pytest.mark.system
def test_a_missing_input_is_a_clear_error(tmp_path):
    result = run_cli("dedup", str(tmp_path / "nope.jsonl"), "--state", str(tmp_path / "s"), check=False)
    assert result.returncode == 2 and b"does not exist" in result.stderr and b"Traceback" not in result.stderr


class _Trickle:
    """A pipe-like input that hands out at most a few bytes per read."""

    def __init__(self, data: bytes, rng: random.Random):
        self.data, self.at, self.rng = data, 0, rng

    def read1(self, size: int) -> bytes:
        end = min(len(self.data), self.at + min(size, self.rng.randint(1, 7)))
        piece, self.at = self.data[self.at:end], end
        return piece


def _batches_line_by_line(data: bytes, size: int) -> list[tuple[bytes, int]]:
    pieces = data.split(b"\n")  # not splitlines: a CR is no line end here
    lines = [piece + b"\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
    return [(b"".join(lines[i:i + size]), len(lines[i:i + size])) for i in range(0, len(lines), size)]


def test_file_blocks_hold_the_same_lines_as_reading_line_by_line(monkeypatch):
    """Blocks of whole lines, however the reads fall: CRLF, empty lines, a last line without newline, long lines."""
    from streamdedup.runtime import source

    rng = random.Random(3)
    for trial in range(2000):
        lines = [bytes(rng.choice(b"ab\r") for _ in range(rng.choice([0, 1, 5, 40]))) for _ in range(rng.randint(0, 12))]
        data = b"\n".join(lines) + rng.choice([b"", b"\n"])
        size = rng.randint(1, 5)
        monkeypatch.setattr(source, "READ_BYTES", rng.choice([1, 3, 1 << 20]))
        blocks = list(source._blocks_of_lines(_Trickle(data, rng), size))
        assert blocks == _batches_line_by_line(data, size), (data, size)


def test_file_batches_give_each_line_its_number_and_the_position_after_it(tmp_path):
    from streamdedup.runtime.source import FilePosition, FileSource

    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"text": "a"}\r\n\n{"text": "b"}\n{"text": "c"}')
    source = FileSource([str(path)])
    batches = list(source.batches(2, FilePosition()))
    assert [(b.first_line, b.count) for b, _ in batches] == [(1, 2), (3, 2)]
    assert [b.values() for b, _ in batches] == [[b'{"text": "a"}\r', b""], [b'{"text": "b"}', b'{"text": "c"}']]
    assert [s.offset for b, _ in batches for s in b.sources()] == [1, 2, 3, 4]
    assert [p for _, p in batches] == [FilePosition(0, 2, 16), FilePosition(0, 4, 43)]
    resumed = list(FileSource([str(path)]).batches(2, FilePosition(0, 2, 16)))
    assert [(b.first_line, b.values()) for b, _ in resumed] == [(3, [b'{"text": "b"}', b'{"text": "c"}'])]


@pytest.mark.system
def test_a_commit_that_fills_the_map_writes_each_batch_once_even_to_stdout(tmp_path, crawl_file):
    reference = _uninterrupted(tmp_path, crawl_file)
    run_dir = tmp_path / "map-full"
    run_dir.mkdir()
    result = dedup(run_dir, [crawl_file], decisions=None,
                   extra=["--decisions", "-", "--set", "worker.batch_size=100"],
                   env={"STREAMDEDUP_TEST_FAIL_AT": "index-commit-map-full:2,index-commit-map-full:5"})
    assert result.stdout == (reference / "decisions.jsonl").read_bytes()
    assert (run_dir / "clean.jsonl").read_bytes() == (reference / "clean.jsonl").read_bytes()
    assert index_snapshot(run_dir / "state") == index_snapshot(reference / "state")
    assert run_cli("check", "--state", str(run_dir / "state")).returncode == 0


@pytest.mark.system
@pytest.mark.parametrize("batch_size", [2000, 400, 300, 120])  # 1, 3 (all prepared here), 4 and 10 batches
def test_the_feed_process_and_this_one_split_the_input_without_a_gap_or_an_overlap(tmp_path, crawl_file, batch_size):
    """A file feed prepares its first batches in the deciding process while the feed process boots, then
    hands over; a stdin feed hands the pipe itself to the feed process. Both decide as one process does."""
    outcomes = {}
    for name, processes, stdin in (("here", 0, None), ("process", 1, None), ("stdin", 1, crawl_file.read_bytes())):
        run_dir = tmp_path / name
        run_dir.mkdir()
        source = "-" if stdin else str(crawl_file)
        run_cli("dedup", source, "--state", str(run_dir / "state"), "--decisions", str(run_dir / "d.jsonl"),
                "--set", f"worker.batch_size={batch_size}", "--set", f"worker.prepare_processes={processes}",
                stdin=stdin)
        outcomes[name] = (run_dir / "d.jsonl").read_bytes()
    assert len(outcomes["here"].splitlines()) == len(crawl_file.read_bytes().splitlines())
    assert outcomes["process"] == outcomes["here"]
    assert outcomes["stdin"] == outcomes["here"].replace(str(crawl_file).encode(), b"-")


@pytest.mark.system
@pytest.mark.parametrize("ready_after", [0, 1, 3, None])  # blocks made here before the process says it is ready
def test_a_file_feed_hands_over_to_its_process_after_any_block_with_the_same_batches(crawl_file, ready_after):
    """Batches are made here until the feed process is ready, whenever that is; the batches, their
    positions and their prepared keys are those of one process reading the input alone."""
    import threading

    import numpy as np

    from streamdedup.runtime.feed import InlineFeed, ProcessFeed
    from streamdedup.runtime.source import FilePosition

    reading, spec, signing, alone = _read_inline(crawl_file)
    assert len(alone) > 4

    feed = ProcessFeed(reading, spec, signing)
    process_ready, feed._ready = feed._ready, threading.Event()  # readiness told here at a chosen block instead
    try:
        feed.start_here_first(InlineFeed(reading.open(), spec, signing), FilePosition(), signing)
        fed = []
        if ready_after == 0:
            feed._ready.set()
        for batch in feed.batches():
            fed.append(batch)
            if ready_after is not None and len(fed) >= ready_after:
                feed._ready.set()
        process_started = feed._started_at > 0
    finally:
        feed.close()
        del process_ready  # kept until the process has it: it is rebuilt from its name, unlinked once freed
    assert [(b.records.first_line, b.records.values(), b.position) for b in fed] == \
        [(b.records.first_line, b.records.values(), b.position) for b in alone]
    assert all(np.array_equal(f.prepared.keys, a.prepared.keys) for f, a in zip(fed, alone))
    assert process_started == (ready_after is not None)


@pytest.mark.parametrize("lines", [True, False])
def test_a_file_feed_hands_over_a_batchs_lines_only_when_they_are_used(crawl_file, lines):
    """What the feed process's loop hands over (here through a queue in this process): without a clean output,
    each ``FileBatch`` with an empty block and everything else as read."""
    import queue
    import threading

    from streamdedup.core.decode import InputSpec
    from streamdedup.core.signing import SigningConfig
    from streamdedup.runtime.feed import Ended, FileReading, _feed_batches
    from streamdedup.runtime.source import FilePosition

    signing, spec, reading = SigningConfig(), InputSpec(), FileReading((str(crawl_file),), 150)
    reader, handed = reading.open(), queue.Queue()
    reader.start(FilePosition())
    _feed_batches(reader, spec, signing, handed, threading.Event(), lines)
    messages = [handed.get_nowait() for _ in range(handed.qsize())]
    read = reading.open()
    read.start(FilePosition())
    blocks = [read.read().records for _ in messages[:-1]]
    assert isinstance(messages[-1], Ended) and len(blocks) > 2
    assert [m.records.block for m in messages[:-1]] == [b.block if lines else b"" for b in blocks]
    assert [(m.records.first_line, len(m.records), m.records.sources()) for m in messages[:-1]] == \
        [(b.first_line, len(b), b.sources()) for b in blocks]
    assert [len(m.prepared.items) for m in messages[:-1]] == [len(b) for b in blocks]


@pytest.mark.parametrize("start_at, bands, lines", [(0, 32, False), (0, 32, True), (1, 32, False), (0, 16, False)])
def test_a_forked_feed_hands_over_its_first_batch_made_ahead_only_when_its_orders_ask_for_it(crawl_file, start_at,
                                                                                           bands, lines):
    """A forked file feed prepares the input's first batch before its orders come, under a new index's signing
    settings (the ``Config``'s); the orders (here through queues in this process) may start it elsewhere or under
    other settings: what it hands over is what a feed started there reads, prepared under the settings ordered."""
    import dataclasses
    import queue
    import threading

    import numpy as np

    from streamdedup import config as config_module
    from streamdedup.core.decode import InputSpec
    from streamdedup.core.signing import signing_config
    from streamdedup.runtime.feed import Ended, FileReading, InlineFeed, _feed_as_ordered, _first_batch_ahead
    from streamdedup.runtime.source import FilePosition

    cfg = config_module.load(None, environ={})
    spec, reading = InputSpec.from_section(cfg.input), FileReading((str(crawl_file),), 150)
    signing = dataclasses.replace(signing_config(cfg), bands=bands, rows=128 // bands)  # 32 bands: the Config's
    first = reading.open()
    first.start(FilePosition())
    order = FilePosition() if not start_at else first.read().position
    expected = InlineFeed(reading.open(), spec, signing)
    expected.start(order)
    alone = list(expected.batches())
    ahead = _first_batch_ahead(reading, reading.open(), spec, cfg)
    assert ahead is not None and ahead.fits(FilePosition(), signing_config(cfg), spec)
    assert ahead.fits(order, signing, spec) == (not start_at and bands == 32)

    orders, handed = queue.Queue(), queue.Queue()
    orders.put((order, signing, spec, lines))
    assert _feed_as_ordered(reading, reading.open(), spec, cfg, orders, handed, threading.Event(), ahead=True)
    messages = [handed.get_nowait() for _ in range(handed.qsize())]
    assert isinstance(messages[-1], Ended) and len(messages) - 1 == len(alone) > 2
    for message, batch in zip(messages, alone):
        assert message.position == batch.position and message.at_end == batch.at_end
        assert message.records.block == (batch.records.block if lines else b"")
        assert message.records.first_line == batch.records.first_line
        assert np.array_equal(message.prepared.keys, batch.prepared.keys)
        assert message.prepared.id_keys == batch.prepared.id_keys
        assert [item[1] for item in message.prepared.items] == [item.id for item in batch.prepared.items]
    assert _first_batch_ahead(FileReading(("-",), 150), reading.open(), spec, cfg) is None
    assert _first_batch_ahead(reading, reading.open(), spec, signing) is None  # no Config: an index's settings
    missing = FileReading((str(crawl_file.parent / "missing.jsonl"),), 150)
    assert _first_batch_ahead(missing, missing.open(), spec, cfg) is None  # the orders' reading reports it


@pytest.mark.system
@pytest.mark.parametrize("lines", [True, False])
def test_a_feed_process_sends_a_file_batchs_lines_only_when_they_are_used(crawl_file, lines):
    """Without a clean output the lines stay in the feed process (an empty block comes over); the batches'
    lines numbers, positions, sources and prepared batches are those read inline either way."""
    import numpy as np

    from streamdedup.runtime.feed import ProcessFeed
    from streamdedup.runtime.source import FilePosition

    reading, spec, signing, alone = _read_inline(crawl_file)
    assert len(alone) > 2

    feed = ProcessFeed(reading, spec, signing)
    try:
        feed.start(FilePosition(), signing, spec, lines)
        fed = list(feed.batches())
    finally:
        feed.close()
    assert [b.records.block for b in fed] == [b.records.block if lines else b"" for b in alone]
    assert [(b.records.first_line, len(b.records), b.records.sources(), b.position, b.at_end) for b in fed] == \
        [(b.records.first_line, len(b.records), b.records.sources(), b.position, b.at_end) for b in alone]
    for f, a in zip(fed, alone):
        assert np.array_equal(f.prepared.keys, a.prepared.keys) and f.prepared.id_keys == a.prepared.id_keys
        assert [(i.id, i.source) for i in f.prepared.items] == [(i.id, i.source) for i in a.prepared.items]


def test_one_process_dedup_makes_the_next_batchs_hashes_on_a_thread_with_the_same_batches(crawl_file, monkeypatch):
    """With ``worker.prepare_processes = 0`` the kernel's part of preparing runs on another thread, a batch ahead
    (``feed.ThreadFeed``); the batches, their positions and their prepared batches are those read inline."""
    import threading

    import numpy as np

    from streamdedup.core import prepare as prepare_module
    from streamdedup.core.decode import InputSpec
    from streamdedup.core.signing import SigningConfig
    from streamdedup.runtime.feed import FileReading, InlineFeed, open_feed
    from streamdedup.runtime.source import FilePosition

    if prepare_module._kernel is None:
        pytest.skip("the kernel is not built: preparing has no part without the GIL to hand to a thread")
    signing, spec, size = SigningConfig(), InputSpec(), 150
    inline = InlineFeed(FileReading((str(crawl_file),), size).open(), spec, signing)
    inline.start(FilePosition())
    alone = list(inline.batches())
    assert len(alone) > 4

    threads = set()
    kernel_call = prepare_module._AsciiCall.run

    def noted(call):
        threads.add(threading.get_ident())
        return kernel_call(call)

    monkeypatch.setattr(prepare_module._AsciiCall, "run", noted)
    feed = open_feed([str(crawl_file)], spec, signing, size, 0, FilePosition())
    try:
        fed = list(feed.batches())
    finally:
        feed.close()
    assert threads and threading.get_ident() not in threads
    assert [(b.records.first_line, b.records.values(), b.position, b.at_end) for b in fed] == \
        [(b.records.first_line, b.records.values(), b.position, b.at_end) for b in alone]
    for f, a in zip(fed, alone):
        assert np.array_equal(f.prepared.keys, a.prepared.keys)
        assert f.prepared.contents == a.prepared.contents and f.prepared.id_keys == a.prepared.id_keys
        assert np.array_equal(f.prepared.shingles.hashes, a.prepared.shingles.hashes)
        assert [i.id for i in f.prepared.items] == [i.id for i in a.prepared.items]


def _read_inline(crawl_file, size: int = 150):
    """The file's reading in batches of ``size`` lines, its input spec and signing (the defaults), and the batches
    one process makes of it alone (``InlineFeed``): what a feed process's batches are compared with."""
    from streamdedup.core.decode import InputSpec
    from streamdedup.core.signing import SigningConfig
    from streamdedup.runtime.feed import FileReading, InlineFeed
    from streamdedup.runtime.source import FilePosition

    signing, spec = SigningConfig(), InputSpec()
    reading = FileReading((str(crawl_file),), size)
    inline = InlineFeed(reading.open(), spec, signing)
    inline.start(FilePosition())
    return reading, spec, signing, list(inline.batches())


def test_the_collector_is_paused_for_a_whole_run_and_on_again_after_it_even_after_a_failure(tmp_path, crawl_file):
    """``dedup_files`` pauses the cycle collector from its first batch to the run's end, between batches too (where
    the feed's thread takes the next batch off the pipe), not only in each batch's commit; it is on again after the
    run, and after a run that failed."""
    import gc

    from streamdedup import config as config_module
    from streamdedup.core.decode import InputSpec
    from streamdedup.engine.engine import Engine
    from streamdedup.ops.progress import Progress
    from streamdedup.runtime.offline import dedup_files

    class Noting(Progress):
        def __init__(self, fail_at=None):
            super().__init__(None, enabled=False)
            self.enabled_between, self.fail_at = [], fail_at

        def update(self, records: int, done: int) -> None:
            self.enabled_between.append(gc.isenabled())
            if len(self.enabled_between) == self.fail_at:
                raise RuntimeError("stopped between batches")

    cfg = config_module.load(None, environ={})
    assert gc.isenabled()
    noting = Noting()
    with Engine(cfg, str(tmp_path / "state")) as engine:
        summary = dedup_files(engine, [str(crawl_file)], InputSpec(), None, str(tmp_path / "decisions.jsonl"), 100,
                              progress=noting, prepare_processes=0)
    assert summary.outcomes["kept"] > 0 and len(noting.enabled_between) > 2
    assert not any(noting.enabled_between) and gc.isenabled()
    failing = Noting(fail_at=2)
    with pytest.raises(RuntimeError), Engine(cfg, str(tmp_path / "other")) as engine:
        dedup_files(engine, [str(crawl_file)], InputSpec(), None, None, 100, progress=failing, prepare_processes=0)
    assert failing.enabled_between == [False, False] and gc.isenabled()


@pytest.mark.system
def test_a_feed_process_slow_to_prepare_its_first_batch_is_not_taken_for_stuck(crawl_file, monkeypatch):
    """The start-up watchdog (``feed.BOOT_TIMEOUT_S``) is for a process that never boots: one that is ready and
    takes longer than it to prepare its first batch (large HTML pages on a busy machine) is waited for, or it
    would be started again, as slow, for ever."""
    import time

    from streamdedup.core import prepare as prepare_module
    from streamdedup.runtime import feed as feed_module
    from streamdedup.runtime.source import FilePosition

    reading, spec, signing, alone = _read_inline(crawl_file)
    slow, calls = prepare_module.prepare_compact, []

    def slowly(*args, **kwargs):
        if not calls:
            time.sleep(2.5)  # past the watchdog and two of the deciding side's 1 s waits
        calls.append(1)
        return slow(*args, **kwargs)

    monkeypatch.setattr(prepare_module, "prepare_compact", slowly)  # the forked process has it too
    monkeypatch.setattr(feed_module, "BOOT_TIMEOUT_S", 0.3)
    feed = feed_module.ProcessFeed(reading, spec, signing, "fork")
    try:
        assert feed._ready.wait(30)
        feed.start(FilePosition(), signing, spec)
        fed = list(feed.batches())
    finally:
        feed.close()
    assert [b.position for b in fed] == [b.position for b in alone]
