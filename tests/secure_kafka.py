"""A broker that demands TLS and SASL and grants nothing without an ACL: deploy/kafka/start.sh --secure.

``SecureBroker`` starts one on ``$STREAMDEDUP_TEST_SECURE_PORT`` (29392; its
controller on the next port, its mutual-TLS port on the one after), or uses
one already running: set ``KAFKA_SECURE_BOOTSTRAP=host:port`` and
``KAFKA_SECURE_DIR`` to the folder start.sh --secure made
(``DATA_DIR/secure``: ca.pem, admin.password, streamdedup.password,
streamdedup.pem, streamdedup.key), and ``KAFKA_SECURE_MTLS_BOOTSTRAP`` to its
mutual-TLS port (without it, the mutual-TLS test says it did not run).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kafka import KafkaAdminClient
from kafka.admin import ACL, ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, ResourcePattern
from kafka.admin import ResourceType

ROOT = Path(__file__).resolve().parent.parent
WORKER_USER = "streamdedup"
ADMIN_USER = "admin"


@dataclass
class SecureBroker:
    bootstrap: str
    secrets: Path  # ca.pem, admin.password, streamdedup.password
    env: dict | None = None  # start.sh's environment, when this broker was started here
    mtls_bootstrap: str | None = None  # the port that asks for a client certificate instead of a password

    @classmethod
    def start(cls, data_dir: Path) -> "SecureBroker":
        from conftest import start_broker

        port = int(os.environ.get("STREAMDEDUP_TEST_SECURE_PORT", "29392"))
        env = dict(os.environ, KAFKA_PORT=str(port), KAFKA_CONTROLLER_PORT=str(port + 1), KAFKA_SECURE="1",
                   KAFKA_MTLS_PORT=str(port + 2), KAFKA_DATA_DIR=str(data_dir / f"secure-broker-{port}"))
        bootstrap = start_broker(env)
        return cls(bootstrap, data_dir / f"secure-broker-{port}" / "secure", env, f"127.0.0.1:{port + 2}")

    @classmethod
    def existing(cls) -> "SecureBroker | None":
        bootstrap = os.environ.get("KAFKA_SECURE_BOOTSTRAP")
        if not bootstrap:
            return None
        return cls(bootstrap, Path(os.environ["KAFKA_SECURE_DIR"]), None,
                   os.environ.get("KAFKA_SECURE_MTLS_BOOTSTRAP") or None)

    def stop(self) -> None:
        if self.env is not None:
            subprocess.run([str(ROOT / "deploy/kafka/stop.sh"), "--wipe"], env=self.env, capture_output=True)

    @property
    def cafile(self) -> str:
        return str(self.secrets / "ca.pem")

    def password(self, user: str) -> str:
        return (self.secrets / f"{user}.password").read_text().strip()

    def client(self, user: str = ADMIN_USER, mechanism: str = "SCRAM-SHA-512") -> dict:
        """kafka-python settings (all but bootstrap_servers) to log in as ``user``."""
        return {"security_protocol": "SASL_SSL", "ssl_cafile": self.cafile, "sasl_mechanism": mechanism,
                "sasl_plain_username": user, "sasl_plain_password": self.password(user)}

    def worker_flags(self, mechanism: str = "SCRAM-SHA-512") -> list[str]:
        """--set flags for the worker's user; the password goes in the environment (``worker_env``)."""
        return ["--set", "kafka.security_protocol=SASL_SSL", "--set", f"kafka.sasl_mechanism={mechanism}",
                "--set", f"kafka.sasl_plain_username={WORKER_USER}", "--set", f"kafka.ssl_cafile={self.cafile}"]

    def certificate_flags(self, with_certificate: bool = True) -> list[str]:
        """--set flags for the worker's user on the mutual-TLS port: its client certificate instead of a
        password (``with_certificate`` False: TLS alone, which that port refuses)."""
        flags = ["--set", "kafka.security_protocol=SSL", "--set", f"kafka.ssl_cafile={self.cafile}"]
        if with_certificate:
            flags += ["--set", f"kafka.ssl_certfile={self.secrets / 'streamdedup.pem'}",
                      "--set", f"kafka.ssl_keyfile={self.secrets / 'streamdedup.key'}"]
        return flags

    def worker_env(self, password: str | None = None) -> dict:
        return {"STREAMDEDUP_KAFKA_SASL_PLAIN_PASSWORD": password or self.password(WORKER_USER)}

    def admin(self) -> KafkaAdminClient:
        return KafkaAdminClient(bootstrap_servers=self.bootstrap, **self.client())

    def grant(self, acls: list[ACL]) -> None:
        admin = self.admin()
        try:
            result = admin.create_acls(acls)
            assert not result["failed"], result["failed"]
        finally:
            admin.close()

    def revoke(self, acls: list[ACL]) -> None:
        admin = self.admin()
        try:
            admin.delete_acls([ACLFilter(a.principal, a.host, a.operation, a.permission_type, a.resource_pattern)
                               for a in acls])
        finally:
            admin.close()


# ---------------------------------------------------------------------------
# The ACLs of deploy/README.md, as written there: kafka-acls.sh commands
# ---------------------------------------------------------------------------

_RESOURCES = {"--topic": ResourceType.TOPIC, "--group": ResourceType.GROUP,
              "--transactional-id": ResourceType.TRANSACTIONAL_ID}


def documented_acl_commands(readme: Path, marker: str = "worker-acls") -> list[str]:
    """The kafka-acls.sh commands of the bash block after ``<!-- marker -->`` in ``readme``."""
    text = readme.read_text(encoding="utf-8")
    block = re.search(rf"<!-- {marker} -->\s*```bash\n(.*?)```", text, re.S)
    assert block, f"{readme}: no ```bash block after <!-- {marker} -->"
    return [line for line in block.group(1).replace("\\\n", " ").splitlines() if line.startswith("kafka-acls.sh")]


def acls_of_command(command: str, values: dict) -> list[ACL]:
    """The ACLs one documented ``kafka-acls.sh --add`` command grants, with $NAMES replaced from ``values``."""
    for name, value in values.items():
        command = command.replace(f"${name}", value).replace(f"${{{name}}}", value)
    args = shlex.split(command)
    assert "--add" in args, command
    principal, operations, resources, pattern = None, [], [], ACLResourcePatternType.LITERAL
    at = 1
    while at < len(args):
        arg = args[at]
        if arg == "--allow-principal":
            principal, at = args[at + 1], at + 2
        elif arg == "--operation":
            operations.append(ACLOperation[re.sub(r"(?<=[a-z])(?=[A-Z])", "_", args[at + 1]).upper()])
            at += 2
        elif arg in _RESOURCES:
            resources.append((_RESOURCES[arg], args[at + 1]))
            at += 2
        elif arg == "--cluster":
            resources.append((ResourceType.CLUSTER, "kafka-cluster"))
            at += 1
        elif arg == "--resource-pattern-type":
            pattern, at = ACLResourcePatternType[args[at + 1].upper()], at + 2
        else:
            at += 2 if arg == "--bootstrap-server" or arg == "--command-config" else 1
    assert principal and operations and resources, command
    return [ACL(principal, "*", op, ACLPermissionType.ALLOW, ResourcePattern(kind, name, pattern))
            for kind, name in resources for op in operations]
