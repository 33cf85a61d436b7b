"""The worker, backfill and the demo against a broker that demands TLS and SASL and grants nothing without an ACL.

The broker is deploy/kafka/start.sh --secure (a SASL_SSL listener taking
SCRAM-SHA-512 and PLAIN, certificates made by keytool, KRaft's
StandardAuthorizer with only "admin" as super user), started here on
``$STREAMDEDUP_TEST_SECURE_PORT`` (29392), or the one at
``$KAFKA_SECURE_BOOTSTRAP`` (see ``secure_kafka``).

- a wrong password, an untrusted certificate, a plaintext client on the TLS
  port (and the other mismatches the access check sorts) each stop the start
  at once with what to check, and the password is never printed;
- the worker's user, granted exactly the ACLs deploy/README.md lists (parsed
  from it), runs the worker, backfill and the demo; with any one of them
  missing it stops naming the resource, the right and the command, and once
  the ACL is granted and the worker started again every input record has
  exactly one outcome on the output topics (read_committed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kafka.admin import ACL, ACLOperation, ACLPermissionType, ResourcePattern, ResourceType
from kafka_helpers import Topics, outcomes, produce, run_worker
from secure_kafka import WORKER_USER, SecureBroker, acls_of_command, documented_acl_commands

from streamdedup.core import corpus

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "deploy" / "README.md"
PRINCIPAL = f"User:{WORKER_USER}"


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    existing = SecureBroker.existing()
    if existing is not None:
        yield existing
        return
    broker = SecureBroker.start(tmp_path_factory.mktemp("secure-kafka"))
    try:
        yield broker
    finally:
        broker.stop()


def crawl_records(docs) -> list[tuple]:
    """The documents as JSON records, and one record that is not JSON (so the dead-letter topic is written too)."""
    records = [(d.id.encode(), json.dumps({"id": d.id, "text": d.text}).encode()) for d in docs]
    return records[:5] + [(b"broken", b"{not json")] + records[5:]


def fresh_input(secure: SecureBroker, docs: int = 60, seed: int = 5) -> tuple[Topics, int]:
    """New topics (made by the admin) with the crawl in the input; how many input records."""
    topics = Topics.fresh(secure.bootstrap, client=secure.client())
    records = crawl_records(corpus.generate(docs, seed=seed))
    produce(secure.bootstrap, topics.raw, records, client=secure.client())
    return topics, len(records)


def names(topics: Topics) -> dict:
    """The values of the variables of deploy/README.md's kafka-acls.sh commands for these topics."""
    return {"BROKER": "-", "ADMIN_PROPERTIES": "-", "PRINCIPAL": PRINCIPAL, "INPUT_TOPIC": topics.raw,
            "CLEAN_TOPIC": topics.clean, "DUPLICATES_TOPIC": topics.duplicates,
            "DEAD_LETTER_TOPIC": topics.dead_letter, "GROUP_ID": f"group-{topics.raw}",
            "TRANSACTIONAL_ID": f"txn-{topics.raw}"}


def documented_acls(topics: Topics, block: str = "worker-acls") -> list[ACL]:
    return [acl for command in documented_acl_commands(README, block) for acl in acls_of_command(command, names(topics))]


def worker(secure: SecureBroker, state: Path, topics: Topics, *extra: str, password: str | None = None,
           timeout: float = 180) -> subprocess.CompletedProcess:
    """``streamdedup run --until-caught-up`` as the worker's user (password in the environment)."""
    return run_worker(state, topics, secure.bootstrap, *secure.worker_flags(), "--set",
                      f"worker.transactional_id=txn-{topics.raw}", *extra, env=secure.worker_env(password),
                      timeout=timeout)


def assert_secret_absent(secure: SecureBroker, *outputs: bytes) -> None:
    for user in (WORKER_USER, "admin"):
        secret = secure.password(user).encode()
        assert all(secret not in output for output in outputs), f"the password of {user!r} was printed"


def assert_exactly_once(secure: SecureBroker, topics: Topics, count: int) -> dict:
    """Every input offset has exactly one outcome on the output topics; the outcomes by kind."""
    found = outcomes(secure.bootstrap, topics, client=secure.client())
    assert sorted(found) == [(0, n) for n in range(count)]
    assert all(len(v) == 1 for v in found.values()), {k: len(v) for k, v in found.items() if len(v) != 1}
    kinds: dict = {}
    for [(kind, _)] in found.values():
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


# ---------------------------------------------------------------------------
# The documented ACLs are enough
# ---------------------------------------------------------------------------

def test_readme_documents_the_acls_of_the_worker_and_of_backfill():
    """The blocks this module grants hold what the worker needs and not IdempotentWrite (Kafka 3.0+)."""
    topics = Topics("raw", "clean", "dups", "dead")
    granted = {(a.resource_pattern.resource_type, a.resource_pattern.resource_name, a.operation)
               for a in documented_acls(topics)}
    assert granted == {
        (ResourceType.TOPIC, "raw", ACLOperation.READ),
        *((ResourceType.TOPIC, t, op) for t in ("clean", "dups", "dead")
          for op in (ACLOperation.WRITE, ACLOperation.DESCRIBE_CONFIGS)),
        (ResourceType.GROUP, "group-raw", ACLOperation.READ),
        (ResourceType.TRANSACTIONAL_ID, "txn-raw", ACLOperation.WRITE),
    }
    backfill = {(a.resource_pattern.resource_type, a.resource_pattern.resource_name, a.operation)
                for a in documented_acls(topics, "backfill-acls")}
    assert backfill == {(ResourceType.GROUP, "group-raw.backfill.", ACLOperation.READ),
                        (ResourceType.TRANSACTIONAL_ID, "streamdedup-", ACLOperation.WRITE)}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_worker_runs_with_exactly_the_documented_acls(secure, tmp_path, mechanism):
    topics, count = fresh_input(secure)
    secure.grant(documented_acls(topics))
    result = run_worker(tmp_path / "state", topics, secure.bootstrap, *secure.worker_flags(mechanism),
                        "--set", f"worker.transactional_id=txn-{topics.raw}", env=secure.worker_env())
    assert result.returncode == 0, result.stderr.decode()
    kinds = assert_exactly_once(secure, topics, count)
    assert kinds["dead_letter"] == 1 and kinds["clean"] > 0 and kinds["duplicates"] > 0
    assert_secret_absent(secure, result.stdout, result.stderr)


def test_worker_runs_over_mutual_tls_and_a_missing_certificate_stops_the_start(secure, tmp_path):
    """On the port that asks for a client certificate (its CN is the user), the worker runs with the same
    documented ACLs; without a certificate it stops at once, saying which settings to give."""
    if secure.mtls_bootstrap is None:
        pytest.skip("the secure broker given (KAFKA_SECURE_BOOTSTRAP) has no mutual-TLS port: "
                    "set KAFKA_SECURE_MTLS_BOOTSTRAP")
    topics, count = fresh_input(secure)
    secure.grant(documented_acls(topics))
    refused = run_worker(tmp_path / "refused", topics, secure.mtls_bootstrap,
                         *secure.certificate_flags(with_certificate=False), timeout=120)
    stderr = refused.stderr.decode()
    assert refused.returncode == 1, stderr
    assert f"the broker at {secure.mtls_bootstrap} refused this client's certificate" in stderr
    assert "set kafka.ssl_certfile and kafka.ssl_keyfile" in stderr
    result = run_worker(tmp_path / "state", topics, secure.mtls_bootstrap, *secure.certificate_flags(),
                        "--set", f"worker.transactional_id=txn-{topics.raw}")
    assert result.returncode == 0, result.stderr.decode()
    kinds = assert_exactly_once(secure, topics, count)
    assert kinds["dead_letter"] == 1 and kinds["clean"] > 0 and kinds["duplicates"] > 0


def test_worker_reads_the_password_from_a_file(secure, tmp_path):
    topics, count = fresh_input(secure, docs=20)
    secure.grant(documented_acls(topics))
    result = run_worker(tmp_path / "state", topics, secure.bootstrap, *secure.worker_flags(),
                        "--set", f"worker.transactional_id=txn-{topics.raw}",
                        "--set", f"kafka.sasl_plain_password_file={secure.secrets / 'streamdedup.password'}")
    assert result.returncode == 0, result.stderr.decode()
    assert_exactly_once(secure, topics, count)
    assert_secret_absent(secure, result.stdout, result.stderr)


def test_backfill_runs_with_the_documented_acls(secure, tmp_path):
    topics, count = fresh_input(secure, docs=40, seed=6)
    secure.grant(documented_acls(topics) + documented_acls(topics, "backfill-acls"))
    result = subprocess.run(
        [sys.executable, "-m", "streamdedup", "backfill", "--topic", topics.raw, "--from-beginning",
         "--state", str(tmp_path / "state"), *topics.settings(secure.bootstrap), *secure.worker_flags()],
        capture_output=True, timeout=180, env=dict(os.environ, **secure.worker_env()))
    assert result.returncode == 0, result.stderr.decode()
    assert_exactly_once(secure, topics, count)
    assert_secret_absent(secure, result.stdout, result.stderr)


def test_demo_runs_on_the_secure_broker(secure, tmp_path):
    env = dict(os.environ, KAFKA_SECURE_BOOTSTRAP=secure.bootstrap, KAFKA_SECURE_DIR=str(secure.secrets),
               DEMO_DIR=str(tmp_path / "demo"), STREAMDEDUP_METRICS_ADDRESS="127.0.0.1:0")
    result = subprocess.run([sys.executable, str(ROOT / "deploy" / "demo.py"), "--secure"], capture_output=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    out = result.stdout.decode()
    assert "logged in as 'streamdedup' with SCRAM-SHA-512 over TLS" in out
    assert "records       1,191" in out and "rejected          1" in out
    assert_secret_absent(secure, result.stdout, result.stderr)


# ---------------------------------------------------------------------------
# A wrong login stops the start, at once and with what to check
# ---------------------------------------------------------------------------

BAD_LOGINS = {
    "wrong password": ([], "wrong-password", "refused the SASL login of user 'streamdedup' (SCRAM-SHA-512)"),
    "wrong password, PLAIN": (["--set", "kafka.sasl_mechanism=PLAIN"], "wrong-password",
                              "refused the SASL login of user 'streamdedup' (PLAIN)"),
    "untrusted certificate": (["--set", "kafka.ssl_cafile="], None,
                              "presented a certificate that is not trusted"),
    "plaintext client on the TLS port": (["--set", "kafka.security_protocol=PLAINTEXT"], None,
                                         "speaks TLS on this port, but kafka.security_protocol is PLAINTEXT"),
    "SASL without TLS on the TLS port": (["--set", "kafka.security_protocol=SASL_PLAINTEXT"], None,
                                         "speaks TLS on this port, but kafka.security_protocol is SASL_PLAINTEXT"),
    "TLS without SASL on the SASL port": (["--set", "kafka.security_protocol=SSL"], None,
                                          "asks for a SASL login (SCRAM-SHA-512, PLAIN)"),
    "mechanism not offered": (["--set", "kafka.sasl_mechanism=SCRAM-SHA-256"], None,
                              "does not offer SASL mechanism 'SCRAM-SHA-256'"),
}


@pytest.fixture(scope="module")
def granted_topics(secure):
    """Topics whose ACLs the worker's user holds (so only the login can be wrong)."""
    topics, count = fresh_input(secure, docs=10)
    secure.grant(documented_acls(topics))
    return topics, count


@pytest.mark.parametrize("case", list(BAD_LOGINS))
@pytest.mark.parametrize("command", ["run", "backfill"])
def test_a_bad_login_stops_the_start_with_what_to_check(secure, granted_topics, tmp_path, case, command):
    """Exit 1 with the access check's message, not the give-up of a broker that never answers."""
    topics, count = granted_topics
    flags, password, expected = BAD_LOGINS[case]
    if command == "run":
        result = worker(secure, tmp_path / "state", topics, *flags, password=password, timeout=120)
    else:
        result = subprocess.run(
            [sys.executable, "-m", "streamdedup", "backfill", "--topic", topics.raw, "--from-beginning",
             "--state", str(tmp_path / "state"), *topics.settings(secure.bootstrap), *secure.worker_flags(),
             *flags], capture_output=True, timeout=120, env=dict(os.environ, **secure.worker_env(password)))
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    assert expected in stderr
    assert "streamdedup: error:" in stderr and "no broker answered" not in stderr
    assert_secret_absent(secure, result.stdout, result.stderr)
    assert b"wrong-password" not in result.stdout + result.stderr
    assert outcomes(secure.bootstrap, topics, client=secure.client()) == {}  # nothing was emitted


# ---------------------------------------------------------------------------
# A missing ACL is named; granting it and starting again loses and doubles nothing
# ---------------------------------------------------------------------------

MISSING = {
    # id: (resource type, which name, operation, also grant Describe, the resource as the message names it)
    "input Read, not even Describe": (ResourceType.TOPIC, "raw", ACLOperation.READ, False, "READ on topic"),
    "input Read": (ResourceType.TOPIC, "raw", ACLOperation.READ, True, "READ on topic"),
    "clean Write, not even Describe": (ResourceType.TOPIC, "clean", ACLOperation.WRITE, False, "WRITE on topic"),
    "clean Write": (ResourceType.TOPIC, "clean", ACLOperation.WRITE, True, "WRITE on topic"),
    "duplicates Write": (ResourceType.TOPIC, "duplicates", ACLOperation.WRITE, True, "WRITE on topic"),
    "dead-letter Write": (ResourceType.TOPIC, "dead_letter", ACLOperation.WRITE, True, "WRITE on topic"),
    "clean DescribeConfigs": (ResourceType.TOPIC, "clean", ACLOperation.DESCRIBE_CONFIGS, False,
                              "DESCRIBE_CONFIGS on topic"),
    "group Read": (ResourceType.GROUP, "group", ACLOperation.READ, False, "READ on group"),
    "transactional id Write": (ResourceType.TRANSACTIONAL_ID, "txn", ACLOperation.WRITE, False,
                               "WRITE on transactional-id"),
}


def resource_name(topics: Topics, which: str) -> str:
    return {"raw": topics.raw, "clean": topics.clean, "duplicates": topics.duplicates,
            "dead_letter": topics.dead_letter, "group": f"group-{topics.raw}", "txn": f"txn-{topics.raw}"}[which]


@pytest.mark.parametrize("case", list(MISSING))
def test_a_missing_acl_is_named_and_once_granted_nothing_is_lost_or_doubled(secure, tmp_path, case):
    kind, which, operation, describe, named = MISSING[case]
    topics, count = fresh_input(secure, docs=80, seed=7)
    name = resource_name(topics, which)
    everything = documented_acls(topics)
    missing = [a for a in everything if a.resource_pattern.resource_type == kind
               and a.resource_pattern.resource_name == name and a.operation == operation]
    assert len(missing) == 1
    granted = [a for a in everything if a not in missing]
    if describe:
        granted.append(ACL(PRINCIPAL, "*", ACLOperation.DESCRIBE, ACLPermissionType.ALLOW,
                           ResourcePattern(kind, name)))
    secure.grant(granted)
    state = tmp_path / "state"

    refused = worker(secure, state, topics, "--set", "worker.batch_size=20")
    stderr = refused.stderr.decode()
    assert refused.returncode == 1, stderr
    assert "the broker refused:" in stderr and f"{named} {name!r}" in stderr
    option = {ResourceType.TOPIC: "--topic", ResourceType.GROUP: "--group",
              ResourceType.TRANSACTIONAL_ID: "--transactional-id"}[kind]
    spelled = {ACLOperation.READ: "Read", ACLOperation.WRITE: "Write",
               ACLOperation.DESCRIBE_CONFIGS: "DescribeConfigs"}[operation]
    assert (f"kafka-acls.sh --bootstrap-server BROKER --command-config admin.properties --add --allow-principal "
            f"{PRINCIPAL} --operation {spelled} {option} {name}") in stderr
    assert_secret_absent(secure, refused.stdout, refused.stderr)
    assert all(len(v) == 1 for v in outcomes(secure.bootstrap, topics, client=secure.client()).values())

    secure.grant(missing)
    again = worker(secure, state, topics, "--set", "worker.batch_size=20")
    assert again.returncode == 0, again.stderr.decode()
    kinds = assert_exactly_once(secure, topics, count)
    assert kinds["dead_letter"] == 1 and kinds["clean"] + kinds["duplicates"] == count - 1


def test_a_tls_client_on_a_plaintext_port_stops_the_start(kafka, secure, tmp_path):
    """The reverse mismatch, on the plaintext test broker: told to use the TLS port or a plaintext protocol."""
    topics = Topics.fresh(kafka)
    result = run_worker(tmp_path / "state", topics, kafka, *secure.worker_flags(), env=secure.worker_env(),
                        timeout=120)
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    assert f"the broker at {kafka} does not speak TLS on this port (it answered in plaintext)" in stderr
    assert_secret_absent(secure, result.stdout, result.stderr)


def test_the_broker_logs_hold_no_password(secure, granted_topics, tmp_path):
    """After a wrong and a right login, neither the broker's logs nor its start-up output hold a password."""
    topics, _ = granted_topics
    worker(secure, tmp_path / "wrong", topics, password="wrong-password", timeout=120)
    assert worker(secure, tmp_path / "right", topics).returncode == 0
    logs = secure.secrets.parent / "logs"
    written = b"".join(path.read_bytes() for path in logs.iterdir() if path.is_file())
    assert b"Kafka Server started" in written
    assert_secret_absent(secure, written)
    assert b"wrong-password" not in written
