"""Chaos on a running deployment whose band tables are split by key (issue 30, item 4): 8 vshards in 2 or 3
processes found by the consumer group and one signer, over about 3,000 documents produced in parts while
processes die. At the end every input record has exactly one outcome (read_committed), the one an
uninterrupted single worker gives it, and the vshards' states hold the decisions the single worker's index
holds.

What happens, between the parts of the input:

- 20 SIGKILLs of a random process (a host or the signer) at a random moment, each started again at once or
  after a while;
- a crash at every named step of the protocol: a process started again after a kill carries a crash switch
  (``faults``) for the next step of its role not crashed at yet, and dies there (exit 137) on its own;
- a host paused with SIGSTOP inside its open Kafka transaction (stopped at ``vshard-kafka-sent`` by the
  pause switch) for longer than ``transaction_timeout_ms`` plus the broker's sweep of timed out
  transactions: the broker aborts it, and when the host resumes its commit is fenced (its log says so) and
  its session starts again, its epochs decided again. While it is stopped it holds its vshards' folders
  (LMDB locks), so the group gives them to others in vain: the deployment waits for it;
- the broker killed and started again;
- a host added, and one removed with SIGTERM (its vshards move through the consumer group).

The events come from a seed and are logged (``chaos.log`` in the test's folder, and the captured output),
each process's own log beside it; ``STREAMDEDUP_TEST_CHAOS_SEED`` picks other events.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
import uuid

import pytest
from conftest import OwnBroker
from kafka_helpers import (
    Deployment,
    Topics,
    outcome_summary,
    outcomes_out,
    produce,
    role_command,
    sharded_records,
    single_worker_run,
    single_worker_summary,
    vshard_decisions,
)

pytestmark = pytest.mark.kafka

SEED = int(os.environ.get("STREAMDEDUP_TEST_CHAOS_SEED", "3030"))  # another seed, other events
COUNT = 8
RANDOM_KILLS = 20
STEPS = {"host": ["vshard-sent", "vshard-kafka-begun", "vshard-kafka-sent", "vshard-kafka-committed",
                  "vshard-committed"],
         "sign": ["values-sent", "signed-sent"]}
TRANSACTION_TIMEOUT_MS = 3000
PAUSED_S = 15  # past the transaction timeout and the broker's sweep of timed out ones (every 10 s)
FENCED = "transaction was fenced"  # in the log of a session ended by a fenced transaction
KEYS = ["--set", "templates.enabled=false", "--set", 'lsh.cap="probes"']
SETTINGS = [*KEYS, "--set", f"kafka.producer={{transaction_timeout_ms={TRANSACTION_TIMEOUT_MS}}}",
            # a killed host holds its vshards until the group drops it: 6 s (the broker's least) stalls less
            "--set", "kafka.consumer={session_timeout_ms=6000, heartbeat_interval_ms=1000}"]


def _commands(topics: Topics, bootstrap: str, folder, settings: tuple = tuple(SETTINGS)) -> dict[str, list[str]]:
    """Three hosts (two at first, one added later) sharing the states' folder, and the signer."""
    tag = uuid.uuid4().hex[:8]
    commands = {f"host-{n}": role_command(topics, bootstrap, COUNT, tag, "--role", "vshards",
                                          "--state", str(folder / "vshards"), *settings)
                for n in range(3)}
    commands["sign"] = role_command(topics, bootstrap, COUNT, tag, "--role", "sign", *settings,
                                    "--set", "shards.epoch_records=150")
    return commands


def _events() -> list[str]:
    """The chaos in order: the random kills, with a host added, a host paused, the broker restarted and a host
    removed at fixed places among them."""
    events = ["kill"] * RANDOM_KILLS
    for at, event in ((4, "add"), (8, "pause"), (12, "broker"), (16, "remove")):
        events.insert(at, event)
    return events


class _Steps:
    """The named steps not crashed at yet, by role: each restart after a kill takes the next of its role."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.left = {role: list(steps) for role, steps in STEPS.items()}

    def next_switch(self, name: str) -> str:
        """A crash switch (``step:N``) for the process ``name``, or "" once its role's steps are all taken."""
        left = self.left[self._role(name)]
        return f"{left.pop(0)}:{self.rng.randint(1, 3)}" if left else ""

    def give_back(self, name: str, switch: str) -> None:
        """A switch whose process was killed before its step: the next restart of the role takes it."""
        if switch:
            self.left[self._role(name)].insert(0, switch.partition(":")[0])

    @staticmethod
    def _role(name: str) -> str:
        return "sign" if name == "sign" else "host"

    def untaken(self) -> list[str]:
        return [step for steps in self.left.values() for step in steps]


def _kill_and_restart(deployment: Deployment, rng: random.Random, steps: _Steps, name: str) -> None:
    steps.give_back(name, deployment.armed.get(name, ""))
    deployment.kill(name)
    time.sleep(rng.choice([0.0, 0.0, rng.uniform(0.5, 4.0)]))  # sometimes down for a while
    deployment.start(name, crash_at=steps.next_switch(name))


def _pause_past_the_transaction_timeout(deployment: Deployment, steps: _Steps, name: str, folder) -> None:
    """Start ``name`` again with the pause switch at ``vshard-kafka-sent`` (its transaction open at the
    broker), stop it there with SIGSTOP, let the broker abort the transaction, resume it, and wait until its
    commit is found fenced (``TransactionFencedError``: the session starts again)."""
    flag = folder / "paused"
    steps.give_back(name, deployment.armed.get(name, ""))
    deployment.kill(name)
    deployment.start(name, env={"STREAMDEDUP_TEST_PAUSE_AT": "vshard-kafka-sent:2",
                                "STREAMDEDUP_TEST_PAUSE_FILE": str(flag)})
    deadline = time.monotonic() + 120
    while not flag.exists():
        deployment.check_running()
        assert time.monotonic() < deadline, f"{name} never reached vshard-kafka-sent"
        time.sleep(0.1)
    deployment.send_signal(name, signal.SIGSTOP)
    flag.unlink()
    time.sleep(PAUSED_S)
    deployment.send_signal(name, signal.SIGCONT)
    deadline = time.monotonic() + 90
    while FENCED not in deployment.log_of(name):
        deployment.check_running()
        assert time.monotonic() < deadline, f"{name}'s late transaction was not fenced"
        time.sleep(0.2)
    deployment.say(f"{name} fenced")


def _outcomes_after_progress(bootstrap: str, topics: Topics, deployment: Deployment, before: int,
                             patience_s: float = 8.0) -> int:
    """How many outcomes are out once more than ``before`` are, or ``patience_s`` later (the deployment may be
    waiting for a dead host's vshards to move), so that the next event lands while epochs are under way."""
    deadline = time.monotonic() + patience_s
    while True:
        out = outcomes_out(bootstrap, topics)
        if out > before or time.monotonic() > deadline:
            return out
        deployment.check_running()
        time.sleep(0.3)


def _happen(event: str, deployment: Deployment, broker: OwnBroker, rng: random.Random, steps: _Steps,
            hosts: list[str]) -> None:
    """Do ``event`` (``_events``) to the deployment whose hosts now are ``hosts`` (changed when one is added or
    removed)."""
    if event == "kill":
        _kill_and_restart(deployment, rng, steps, rng.choice([*hosts, "sign"]))
    elif event == "add":
        hosts.append("host-2")
        deployment.start("host-2")
    elif event == "pause":
        _pause_past_the_transaction_timeout(deployment, steps, rng.choice(hosts), deployment.folder)
    elif event == "broker":
        broker.stop("kill")
        deployment.say("broker killed")
        time.sleep(2)
        broker.start()
        deployment.say("broker started")
    elif event == "remove":
        removed = rng.choice([h for h in hosts if h not in deployment.armed])
        hosts.remove(removed)
        deployment.remove(removed)


def test_vshards_under_chaos_decide_every_record_once_as_one_worker(tmp_path_factory, tmp_path):
    broker = OwnBroker(tmp_path_factory.mktemp("vchaos"))
    bootstrap = broker.bootstrap
    try:
        records = sharded_records(articles=1600, seed=31, replays=150)
        expected, held = single_worker_run(records, KEYS)
        assert len(expected) > 3000

        topics = Topics.fresh(bootstrap)
        rng = random.Random(SEED)
        events = _events()
        steps = _Steps(rng)
        parts = len(events) + 1
        chunk = -(-len(records) // parts)
        with open(tmp_path / "chaos.log", "w") as chaos_log:
            deployment = Deployment(_commands(topics, bootstrap, tmp_path), tmp_path, chaos_log)
            hosts = ["host-0", "host-1"]
            try:
                deployment.say(f"seed {SEED}: {' '.join(events)}")
                for name in [*hosts, "sign"]:
                    deployment.start(name)
                produce(bootstrap, topics.raw, records[:chunk])
                out = 0
                for part, event in enumerate(events, start=1):
                    out = _outcomes_after_progress(bootstrap, topics, deployment, out)
                    time.sleep(rng.uniform(0.0, 1.5))
                    deployment.check_running()
                    deployment.say(f"{event} ({out} outcomes out)")
                    following = records[part * chunk:(part + 1) * chunk]
                    if event != "pause":
                        _happen(event, deployment, broker, rng, steps, hosts)
                        produce(bootstrap, topics.raw, following)
                        continue
                    # the paused host waits for its second open transaction: the next part goes in meanwhile, in
                    # two halves a second apart, so epochs come whatever was left when it started again
                    produce(bootstrap, topics.raw, following[:len(following) // 2])
                    later = threading.Timer(1.0, produce, (bootstrap, topics.raw, following[len(following) // 2:]))
                    later.start()
                    try:
                        _happen(event, deployment, broker, rng, steps, hosts)
                    finally:
                        later.join()
                under_way = outcomes_out(bootstrap, topics)
                deployment.say(f"chaos done; {under_way} of {len(expected)} outcomes out")
                assert under_way < len(expected), "the deployment finished before the chaos did"
                found = deployment.settled_outcomes(bootstrap, topics, len(expected))
                deployment.check_running()
                deployment.say(f"crashed at {', '.join(sorted(deployment.crashed_at))}")
            finally:
                deployment.stop()
        assert outcome_summary(found) == expected
        assert vshard_decisions(tmp_path / "vshards", COUNT, SETTINGS) == held
        assert not steps.untaken(), f"no restart crashed at {steps.untaken()}: another seed, or more kills"
        assert sorted(s.partition(":")[0] for s in deployment.crashed_at) == sorted(sum(STEPS.values(), []))
    finally:
        broker.wipe()


def _members_followed(log: str) -> list[str]:
    """The member ids under which a host followed the group's generations, in order (``vshards_group_followed``)."""
    return re.findall(r'vshards_group_followed .*?member="([^"]*)"', log)


def _two_hosts_and_a_signer(bootstrap: str, folder, chaos_log, settings: tuple = tuple(SETTINGS)) -> tuple:
    """A deployment of two hosts found by the group and a signer, started, on the first half of a small input;
    returns it, its topics, the records and their single worker's outcomes."""
    records = sharded_records(articles=300, seed=12)
    expected = single_worker_summary(records, KEYS)
    topics = Topics.fresh(bootstrap)
    deployment = Deployment(_commands(topics, bootstrap, folder, settings), folder, chaos_log)
    for name in ("host-0", "host-1", "sign"):
        deployment.start(name)
    produce(bootstrap, topics.raw, records[:len(records) // 2])
    return deployment, topics, records, expected


def test_hosts_keep_their_group_members_through_a_broker_restart(tmp_path_factory, tmp_path):
    """The broker killed and started again (15 s on a loaded machine) while epochs go on: each host goes on, its
    sessions (those that ended, the broker lost) with the member it had: its client reconnects within a second
    of the broker's return (``host.MEMBER_RECONNECT``), inside the group's session (the default 10 s: at 6 s a
    broker killed has dropped the members when it answers again); every record has one outcome, the single
    worker's."""
    broker = OwnBroker(tmp_path_factory.mktemp("vrestart"))
    bootstrap = broker.bootstrap
    settings = (*SETTINGS, "--set", "kafka.consumer={session_timeout_ms=10000, heartbeat_interval_ms=1000}")
    try:
        with open(tmp_path / "chaos.log", "w") as chaos_log:
            deployment, topics, records, expected = _two_hosts_and_a_signer(bootstrap, tmp_path, chaos_log, settings)
            try:
                _outcomes_after_progress(bootstrap, topics, deployment, 0, patience_s=120)
                broker.stop("kill")
                deployment.say("broker killed")
                time.sleep(2)
                broker.start()
                deployment.say("broker started")
                produce(bootstrap, topics.raw, records[len(records) // 2:])
                found = deployment.settled_outcomes(bootstrap, topics, len(expected))
                logs = [deployment.log_of(name) for name in ("host-0", "host-1")]
            finally:
                deployment.stop()
        assert outcome_summary(found) == expected
        assert not any("vshards_group_lost" in log for log in logs)
        assert [len(set(_members_followed(log))) for log in logs] == [1, 1], [_members_followed(x) for x in logs]
    finally:
        broker.wipe()