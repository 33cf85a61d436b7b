"""The Kafka ACLs a run needs, and what to grant when the broker refuses one.

A broker with an authorizer answers a missing right with an error that names
the kind of resource (``TopicAuthorizationFailed``, ``GroupAuthorizationFailed``,
``TransactionalIdAuthorizationFailed``, ``ClusterAuthorizationFailed``) and
at best the topic. ``Rights`` knows which topics, group and transactional id
this run uses and for what, so a refusal becomes a ``BrokerError`` that names
the resource, the operation and the ``kafka-acls.sh`` command that grants it
(deploy/README.md lists them all).

A topic the user may not even describe looks the same as a missing topic
(the broker hides it); ``check_topics`` asks for each topic by name at the
start of a session, so the message says both.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Optional

from ..errors import BrokerError

__all__ = ["Right", "Rights", "check_topics"]

TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC = 29, 3


@dataclass(frozen=True)
class Right:
    """One ACL: ``operation`` (as kafka-acls.sh spells it) on a resource."""

    operation: str  # Read, Write, DescribeConfigs, IdempotentWrite
    kind: str  # topic, group, transactional-id, cluster
    name: str = ""
    prefixed: bool = False

    def command(self, principal: str) -> str:
        """The kafka-acls.sh command that grants this right to ``principal``."""
        resource = "--cluster" if self.kind == "cluster" else f"--{self.kind} {shlex.quote(self.name)}"
        pattern = " --resource-pattern-type prefixed" if self.prefixed else ""
        return (f"kafka-acls.sh --bootstrap-server BROKER --command-config admin.properties --add "
                f"--allow-principal {shlex.quote(principal)} --operation {self.operation} {resource}{pattern}")

    def resource(self) -> str:
        """The resource, as in "topic 'clean'"."""
        if self.kind == "cluster":
            return "the cluster"
        prefix = " (prefixed)" if self.prefixed else ""
        return f"{self.kind} {self.name!r}{prefix}"

    def describe(self) -> str:
        """The right as Kafka's AclOperation names it, and its resource: "WRITE on topic 'clean'"."""
        operation = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", self.operation).upper()
        return f"{operation} on {self.resource()}"


@dataclass
class Rights:
    """What a run reads, writes and commits under, for the messages of a refusal."""

    principal: str
    inputs: list[str]
    outputs: list[str] = field(default_factory=list)
    group: str = ""
    transactional_id: Optional[str] = None

    @classmethod
    def of(cls, kafka_settings: dict, inputs: list[str], outputs: list[str], group: str,
           transactional_id: Optional[str]) -> "Rights":
        user = kafka_settings.get("sasl_plain_username")
        principal = f"User:{user}" if user else "User:<the worker's principal>"
        return cls(principal, list(inputs), [t for t in outputs if t], group, transactional_id)

    def needed(self) -> list[Right]:
        """Every ACL the run needs (Read and Write imply Describe)."""
        needed = [Right("Read", "topic", t) for t in self.inputs]
        needed += [Right(op, "topic", t) for t in self.outputs for op in ("Write", "DescribeConfigs")]
        needed.append(Right("Read", "group", self.group))
        if self.transactional_id:
            needed.append(Right("Write", "transactional-id", self.transactional_id))
        return needed

    def refused(self, error: str, rights: list[Right], subject: str = "", hint: str = "") -> BrokerError:
        """The message for ``error`` (the broker's error name) on ``rights``: what to grant, and how."""
        where = "; ".join(r.describe() for r in rights)
        resources = ", ".join(dict.fromkeys(r.resource() for r in rights))
        commands = "\n  ".join(r.command(self.principal) for r in rights)
        return BrokerError(f"the broker refused: {error} on {subject or resources}{hint}; grant {where} to the "
                           f"worker's principal {self.principal} (deploy/README.md lists every ACL the worker "
                           f"needs):\n  {commands}")

    def explain(self, exc: BaseException) -> Optional[BrokerError]:
        """A ``BrokerError`` naming the missing right, if ``exc`` is the broker refusing one; else None."""
        name = type(exc).__name__
        if name == "TopicAuthorizationFailedError":
            return self._topics_refused(exc)
        if name == "GroupAuthorizationFailedError":
            return self.refused("GroupAuthorizationFailed", [Right("Read", "group", self.group)])
        if name == "TransactionalIdAuthorizationFailedError" and self.transactional_id:
            return self.refused("TransactionalIdAuthorizationFailed",
                                [Right("Write", "transactional-id", self.transactional_id)])
        if name == "ClusterAuthorizationFailedError":
            return self.refused("ClusterAuthorizationFailed", [Right("IdempotentWrite", "cluster")],
                                hint=" (brokers before Kafka 3.0 want it of transactional producers)")
        return None

    def _topics_refused(self, exc: BaseException) -> BrokerError:
        named = {t for arg in exc.args for t in (arg if isinstance(arg, (set, list, tuple)) else [arg])
                 if isinstance(t, str) and (t in self.inputs or t in self.outputs)}
        wanted = [r for r in self.needed() if r.kind == "topic" and r.operation != "DescribeConfigs"
                  and (not named or r.name in named)]
        subject = "" if named else "a topic the broker did not name (one of these)"
        return self.refused("TopicAuthorizationFailed", wanted, subject)


def check_topics(admin_settings: dict, rights: Rights) -> None:
    """Stop with what to do if an input or output topic is missing or hidden from this user."""
    from .sink.admin import admin_client

    topics = rights.inputs + rights.outputs
    admin = admin_client(admin_settings)
    try:
        described = admin.describe_topics(topics)
    finally:
        admin.close()
    codes = {d["name"]: d.get("error_code", 0) for d in described}
    for topic in topics:
        needed = [r for r in rights.needed() if r.kind == "topic" and r.name == topic
                  and r.operation != "DescribeConfigs"]
        role = "input" if topic in rights.inputs else "output"
        fix = "input.topics" if role == "input" else "the [output] section"
        if codes.get(topic) == TOPIC_AUTHORIZATION_FAILED:
            raise rights.refused("TopicAuthorizationFailed", needed, f"{role} topic {topic!r}",
                                 f" (the broker hides topics a user may not describe: if it does not exist, "
                                 f"create it or fix {fix}; else)")
        if codes.get(topic) == UNKNOWN_TOPIC:
            create = ", or set output.create_topics = true to have the worker create it" if role == "output" else ""
            raise BrokerError(f"{role} topic {topic!r} does not exist; create it (see deploy/), or fix {fix}{create}")
