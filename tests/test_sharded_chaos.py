"""Chaos on a running sharded deployment: 3 shards and 2 signers over 20,000 documents, shards and signers
killed with -9 at random moments and started again, the broker restarted once; at the end every input record
has exactly one outcome, the one an uninterrupted single worker gave it. The input arrives in 24 parts, one
before each kill; the last kill comes right after the last part, so the deployment is still deciding it
(a kill a few seconds after a part may find that part decided already: the deployment is quick).

The kills come from a fixed seed and are logged (``chaos.log`` in the test's folder, and the captured output),
with each process's own log beside it, so a failure can be replayed and read; ``STREAMDEDUP_TEST_CHAOS_SEED``
picks other kills.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import uuid

import pytest
from conftest import OwnBroker
from kafka_helpers import (
    Topics,
    outcome_summary,
    outcomes,
    produce,
    role_command,
    single_worker_summary,
    sharded_records,
    stop_processes,
)

pytestmark = pytest.mark.kafka

SEED = int(os.environ.get("STREAMDEDUP_TEST_CHAOS_SEED", "2026"))  # another seed, another run of kills
KILLS = 24
BROKER_RESTART_AFTER = 12  # kills
COUNT = 3
SIGNERS = 2


class Deployment:
    """The shards and signers of one deployment, each restartable, logging to its own file (appended)."""

    def __init__(self, topics: Topics, bootstrap: str, folder, chaos_log):
        self.folder = folder
        self.chaos_log = chaos_log
        tag = uuid.uuid4().hex[:8]
        self.commands = {f"shard-{n}": role_command(topics, bootstrap, COUNT, tag, "--role", "shard",
                                                    "--shard", str(n), "--state", str(folder / f"shard-{n}"))
                         for n in range(COUNT)}
        self.commands.update({f"sign-{n}": role_command(topics, bootstrap, COUNT, tag, "--role", "sign",
                                                        "--set", "worker.batch_size=250")
                              for n in range(SIGNERS)})
        self.processes: dict[str, subprocess.Popen] = {}
        self.began = time.monotonic()

    def say(self, what: str) -> None:
        line = f"{time.monotonic() - self.began:7.2f}s {what}"
        print(line)
        self.chaos_log.write(line + "\n")
        self.chaos_log.flush()

    def start(self, name: str) -> None:
        with open(self.folder / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(self.commands[name], stdout=subprocess.DEVNULL, stderr=log)
        self.say(f"started {name} (pid {self.processes[name].pid})")

    def kill(self, name: str) -> None:
        process = self.processes[name]
        ended = process.poll()
        assert ended is None, f"{name} ended by itself with {ended}: see {self.folder / (name + '.log')}"
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        self.say(f"killed {name} (pid {process.pid})")

    def check_running(self) -> None:
        for name, process in self.processes.items():
            assert process.poll() is None, (f"{name} ended with {process.returncode}:\n"
                                            f"{(self.folder / (name + '.log')).read_text()[-3000:]}")

    def stop(self) -> None:
        stop_processes(list(self.processes.values()))


def _wait_for_every_outcome(bootstrap: str, topics: Topics, expected: int, deployment: Deployment,
                            timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = outcomes(bootstrap, topics)
        total = sum(len(v) for v in found.values())
        if total >= expected:
            return found
        deployment.check_running()
        assert time.monotonic() < deadline, f"{total} of {expected} outcomes {timeout} s after the last kill"
        time.sleep(1)


def test_kill_9_shards_and_signers_and_restart_the_broker_every_record_decided_once_as_one_worker(
        tmp_path_factory, tmp_path):
    broker = OwnBroker(tmp_path_factory.mktemp("chaos"))
    bootstrap = broker.bootstrap
    try:
        records = sharded_records(web=False, articles=10900, seed=77, replays=400)
        expected = single_worker_summary(records)
        assert len(expected) == len(records) - 400 >= 20000  # a replayed record emits nothing

        topics = Topics.fresh(bootstrap)  # the same records, fed while the deployment runs and dies
        chunk = -(-len(records) // KILLS)
        rng = random.Random(SEED)
        with open(tmp_path / "chaos.log", "w") as chaos_log:
            deployment = Deployment(topics, bootstrap, tmp_path, chaos_log)
            try:
                deployment.say(f"seed {SEED}")
                for name in deployment.commands:
                    deployment.start(name)
                for kill in range(1, KILLS + 1):
                    produce(bootstrap, topics.raw, records[(kill - 1) * chunk:kill * chunk])
                    pause = rng.uniform(0.5, 4.0)
                    if kill < KILLS:
                        time.sleep(pause)
                    else:
                        under_way = sum(len(v) for v in outcomes(bootstrap, topics).values())
                        deployment.say(f"{under_way} of {len(expected)} outcomes out before the last kill")
                        assert under_way < len(expected), "the deployment finished before the last kill"
                    name = rng.choice(sorted(deployment.commands))
                    deployment.kill(name)
                    time.sleep(rng.choice([0.0, 0.0, rng.uniform(0.5, 5.0)]))  # sometimes down for a while
                    deployment.start(name)
                    if kill == BROKER_RESTART_AFTER:
                        broker.stop("kill")
                        deployment.say("broker killed")
                        time.sleep(3)
                        broker.start()
                        deployment.say("broker started")
                deployment.say(f"{KILLS} kills done")
                _wait_for_every_outcome(bootstrap, topics, len(expected), deployment)
                deployment.say("every outcome out")
                time.sleep(3)  # anything more (a second outcome) would show now
                found = outcomes(bootstrap, topics)
            finally:
                deployment.stop()
        assert outcome_summary(found) == expected
    finally:
        broker.wipe()
