"""The sample crawl through a sharded deployment on a local broker: its band tables split by key over 8 virtual
shards hosted by 2 processes, and 2 signing processes.

1. start a local Apache Kafka broker (as ``make demo``: deploy/kafka/start.sh),
   unless KAFKA_BOOTSTRAP names one already running;
2. create the input topic (one partition, so that the deployment's decision
   order is the input's and every decision can be compared with the single
   worker's) and the output topics, names unique to this run;
3. feed the sample crawl and one malformed record (``demo.feed_sample``);
4. start 2 processes hosting the virtual shards (``run --role vshards``: a
   consumer group gives each some of the 8; their states are folders
   ``vshard-N`` of one folder) and 2 signing processes (``run --role sign``,
   one consumer group: with a one-partition input one signs, the other
   stands by);
5. wait until every input record has exactly one outcome in the output
   topics (read back with read_committed), then stop the processes;
6. run the single worker (``run --until-caught-up``) on the same input into
   outputs of its own, and compare: every record's outcome (topic, cluster,
   matched document, similarity) must be the same;
7. print a summary as ``make demo`` does, and stop the broker it started.

The roles, and the single worker compared with, use config.toml with what a
deployment split by key needs (``KEYS``: site templates off, which learn
nothing on the sample crawl anyway, as it has no URLs; a band key's places
counted over its probers, ``lsh.cap = "probes"``).

Run: ``make demo-sharded`` (or ``python deploy/demo_sharded.py`` inside the virtualenv). Exit status 1 when
an outcome is missing, doubled, or differs from the single worker's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from demo import ROOT, feed_sample, read_topic, start_local_broker, stop_local_broker, stop_processes

WORK = Path(os.environ.get("DEMO_DIR", ROOT / "build" / "demo-sharded"))  # emptied at start
VSHARDS = 8
HOSTS = 2
SIGNERS = 2
KEYS = ("--set", "templates.enabled=false", "--set", 'lsh.cap="probes"')
KINDS = ("clean", "duplicates", "dead_letter")
TIMEOUT_S = float(os.environ.get("DEMO_TIMEOUT_S", "300"))


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    (WORK / "logs").mkdir(parents=True)
    broker_env = dict(os.environ, KAFKA_DATA_DIR=str(WORK / "kafka"))
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    started_here = bootstrap is None
    if started_here:
        bootstrap = start_local_broker(broker_env)
        if bootstrap is None:
            return 1
    try:
        return demo(bootstrap)
    finally:
        if started_here:
            stop_local_broker(broker_env)


def demo(bootstrap: str) -> int:
    tag = uuid.uuid4().hex[:8]
    raw = f"raw-{tag}"
    sharded = {k: f"{k.replace('_', '-')}-sharded-{tag}" for k in KINDS}
    single = {k: f"{k.replace('_', '-')}-single-{tag}" for k in KINDS}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(raw, 1, 1)] + [NewTopic(t, 1, 1) for t in [*sharded.values(), *single.values()]])
    admin.close()
    fed = feed_sample(bootstrap, raw, {})
    print(f"fed {fed:,} records (the sample crawl and one malformed record) into {raw} (1 partition) on {bootstrap}",
          flush=True)

    print(f"starting {HOSTS} processes hosting {VSHARDS} virtual shards and {SIGNERS} signing processes (logs in "
          f"{WORK / 'logs'}) ...", flush=True)
    began = time.monotonic()
    processes = start_deployment(bootstrap, raw, sharded, tag)
    try:
        found = wait_for_outcomes(bootstrap, raw, sharded, fed, processes)
        seconds = time.monotonic() - began
        time.sleep(2)  # a second outcome of any record would show now
        found = outcomes(bootstrap, raw, sharded)
    finally:
        stop_processes(processes)
    print(f"stopped the {len(processes)} processes of the deployment")
    doubled = sorted(where for where, outs in found.items() if len(outs) != 1)

    print("running the single worker (run --until-caught-up) on the same input ...", flush=True)
    worker = subprocess.run(role_command(bootstrap, raw, single, f"single-{tag}", WORK / "single", *KEYS),
                            stdout=subprocess.DEVNULL, stderr=open(WORK / "logs" / "single.log", "wb"))
    if worker.returncode != 0:
        print(f"the single worker failed: see {WORK / 'logs' / 'single.log'}", file=sys.stderr)
        return worker.returncode
    expected = outcomes(bootstrap, raw, single)
    differ = sorted(where for where in set(found) | set(expected) if found.get(where) != expected.get(where))

    counts = {k: sum(1 for outs in found.values() for out in outs if out[0] == k) for k in KINDS}
    print()
    print(f"summary ({VSHARDS} virtual shards in {HOSTS} processes, {SIGNERS} signing processes; read back from the "
          "output topics, read_committed)")
    print(f"  records     {sum(counts.values()):>7,}   ({fed / seconds:,.0f} records/s, deployment start to the last "
          f"outcome: {seconds:.1f} s)")
    print(f"  kept        {counts['clean']:>7,}   -> {sharded['clean']}")
    print(f"  duplicates  {counts['duplicates']:>7,}   -> {sharded['duplicates']}")
    print(f"  rejected    {counts['dead_letter']:>7,}   -> {sharded['dead_letter']}")
    print(f"  states      {WORK}/vshards/vshard-0 .. vshard-{VSHARDS - 1}")
    print(f"  settings    config.toml, shards.count={VSHARDS}, templates.enabled=false, "
          "lsh.cap=\"probes\"")
    alone = {k: sum(1 for outs in expected.values() for out in outs if out[0] == k) for k in KINDS}
    print(f"  one worker  kept {alone['clean']:,}, duplicates {alone['duplicates']:,}, rejected "
          f"{alone['dead_letter']:,}   (run --until-caught-up on the same input)")
    ok = not doubled and not differ and len(found) == fed
    if ok:
        print(f"every record has exactly one outcome, and it is the single worker's: same as the single worker "
              f"({len(expected):,} of {fed:,} records)")
        return 0
    if len(found) != fed:
        print(f"{fed - len(found)} records have no outcome", file=sys.stderr)
    if doubled:
        print(f"{len(doubled)} records have more than one outcome, e.g. {doubled[:5]}", file=sys.stderr)
    if differ:
        print(f"{len(differ)} records differ from the single worker's outcome, e.g. "
              f"{[(w, found.get(w), expected.get(w)) for w in differ[:3]]}", file=sys.stderr)
    return 1


def role_command(bootstrap: str, raw: str, outputs: dict, group: str, state, *extra: str) -> list[str]:
    """A ``streamdedup run`` command on config.toml with this run's topics (the single worker's when no --role)."""
    command = [sys.executable, "-m", "streamdedup", "run", "--config", str(ROOT / "config.toml"),
               "--set", f"kafka.bootstrap_servers={bootstrap}", "--set", f"input.topics={raw}",
               "--set", f"output.clean_topic={outputs['clean']}",
               "--set", f"output.duplicates_topic={outputs['duplicates']}",
               "--set", f"output.dead_letter_topic={outputs['dead_letter']}", "--set", f"kafka.group_id={group}",
               "--set", f"worker.transactional_id={group}", "--set", "metrics.address=127.0.0.1:0", *extra]
    if state is not None:
        command += ["--state", str(state)]
    if "--role" not in extra:
        command.append("--until-caught-up")
    return command


def start_deployment(bootstrap: str, raw: str, outputs: dict, tag: str) -> list[subprocess.Popen]:
    """The processes hosting the virtual shards, then the signing processes; each logs to WORK/logs."""
    shared = ("--set", f"shards.count={VSHARDS}", "--set", f"shards.signed_topic=signed-{tag}", "--set", f"shards.evidence_topic=exchange-{tag}", *KEYS)
    group = f"sharded-{tag}"
    roles = [(f"vshards-{n}", WORK / "vshards", ("--role", "vshards")) for n in range(HOSTS)]
    roles += [(f"sign-{n}", None, ("--role", "sign")) for n in range(SIGNERS)]
    processes = []
    for name, state, role in roles:
        log = open(WORK / "logs" / f"{name}.log", "wb")
        processes.append(subprocess.Popen(role_command(bootstrap, raw, outputs, group, state, *role, *shared),
                                          stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return processes


def wait_for_outcomes(bootstrap: str, raw: str, outputs: dict, expected: int, processes) -> dict:
    """Read the outputs until ``expected`` records have an outcome; a process that fails stops the wait."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        found = outcomes(bootstrap, raw, outputs)
        if len(found) >= expected:
            return found
        failed = [p for p in processes if p.poll() is not None]
        if failed:
            raise RuntimeError(f"a process of the deployment stopped (exit {failed[0].returncode}): see the logs in "
                               f"{WORK / 'logs'}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(found)} of {expected} records have an outcome after {TIMEOUT_S:.0f} s: see the "
                               f"logs in {WORK / 'logs'}")
        time.sleep(1)


def outcomes(bootstrap: str, raw: str, outputs: dict) -> dict:
    """Input offset -> the outcomes naming it: (topic kind, cluster, matched, similarity) each."""
    found: dict = {}
    for kind in KINDS:
        for message in read_topic(bootstrap, outputs[kind]):
            headers = dict(message.headers or ())
            source = headers["streamdedup.source"].decode()
            assert source.rsplit("/", 2)[0] == raw, source
            found.setdefault(int(source.rsplit("/", 1)[1]), []).append((kind, *what_was_decided(kind, message)))
    return found


def what_was_decided(kind: str, message) -> tuple:
    if kind == "clean":
        return (dict(message.headers)["streamdedup.cluster"].decode(),)
    if kind == "duplicates":
        body = json.loads(message.value)
        return body["cluster"], body["matched"], body["similarity"], body["exact"]
    return ()


if __name__ == "__main__":
    sys.exit(main())
