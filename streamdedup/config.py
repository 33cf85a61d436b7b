"""Configuration: frozen dataclasses, one per ``config.toml`` section.

Precedence, lowest first: built-in defaults, the TOML file, environment
variables ``STREAMDEDUP_<SECTION>_<KEY>`` (``STREAMDEDUP_LSH_THRESHOLD=0.8``),
then ``--set section.key=value`` flags. Values from the environment and
``--set`` are read as TOML values when they parse as one (``0.8``,
``true``, ``["a", "b"]``) and as plain strings otherwise.

Everything is checked before anything runs: an unknown key, a wrong type or
an out-of-range value raises ``ConfigError`` naming the section, the key and
the nearest valid key. The ``[kafka]`` section (and ``[kafka.consumer]``,
``[kafka.producer]``) takes kafka-python's own setting names and passes them
through; secrets may come from ``sasl_plain_password_file`` or the
environment and are never printed (``redacted``).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from .errors import ConfigError

__all__ = ["Config", "load", "with_values", "SECTIONS", "redacted", "kafka_client_settings",
           "transaction_producer_settings"]

# A transaction's batches must outlive the worker's waits for its commit (``worker.kafka_timeout_s`` twice: the
# offsets joined, then the commit) by this much: kafka-python fails a batch that outlives the producer's
# ``delivery_timeout_ms`` without failing its transaction (the Java client aborts it), so a commit that came after
# would leave that batch's outcomes out while the input offsets moved on.
DELIVERY_MARGIN_S = 60.0


def _key(default: Any, doc: str, *, choices: tuple = (), low: Optional[float] = None,
         high: Optional[float] = None, secret: bool = False) -> Any:
    meta = {"doc": doc, "choices": choices, "low": low, "high": high, "secret": secret}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class KafkaSection:
    bootstrap_servers: str = _key("127.0.0.1:19092", "broker address(es), comma separated")
    security_protocol: str = _key("PLAINTEXT", "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
                                  choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"))
    sasl_mechanism: str = _key("", "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, ... (empty: none)")
    sasl_plain_username: str = _key("", "SASL user name")
    sasl_plain_password: str = _key("", "SASL password; better from the environment or the file below", secret=True)
    sasl_plain_password_file: str = _key("", "file holding the SASL password (first line)")
    ssl_cafile: str = _key("", "CA bundle to verify the broker")
    ssl_certfile: str = _key("", "client certificate (mutual TLS)")
    ssl_keyfile: str = _key("", "client private key (mutual TLS)")
    client_id: str = _key("streamdedup", "client id shown in broker logs and quotas")
    group_id: str = _key("streamdedup", "consumer group; its committed offsets show the worker's lag")
    consumer: dict = _key({}, "extra kafka-python KafkaConsumer settings ([kafka.consumer])")
    producer: dict = _key({}, "extra kafka-python KafkaProducer settings ([kafka.producer])")


@dataclass(frozen=True)
class InputSection:
    topics: list = _key(["raw"], "topics the worker consumes (all partitions)")
    format: str = _key("json", "record value format (html: a page, its main content extracted; the key is its id "
                       "and URL)", choices=("json", "msgpack", "text", "html"))
    id_field: str = _key("id", "dotted path of the document id ('' for none: key, then source)")
    text_field: str = _key("text", "dotted path of the document text")
    url_field: str = _key("url", "dotted path of the page's URL; its host is the site whose template is learned ('' for none)")
    html_field: str = _key("", "dotted path of a page's HTML in a JSON or msgpack record: its main content is the "
                           "text, as with format html (a record without it: text_field; '' for none)")
    max_record_bytes: int = _key(8 << 20, "larger records are rejected as too_large", low=1)
    max_text_bytes: int = _key(1 << 20, "longer texts (UTF-8 bytes) are rejected as text_too_large; the worker "
                               "lowers it to what the clean topic's max.message.bytes holds, less 16 KiB", low=1)
    binary_keys: str = _key("reject", "a Kafka key that is not UTF-8: reject the record or ignore the key",
                            choices=("reject", "ignore"))


@dataclass(frozen=True)
class OutputSection:
    clean_topic: str = _key("clean", "kept documents, key and value bytes untouched")
    duplicates_topic: str = _key("duplicates", "one JSON announcement per duplicate ('' to skip)")
    dead_letter_topic: str = _key("dead-letter", "rejected records, original bytes, reason in headers")
    dead_letter_max_bytes: int = _key(1000000, "longer rejected values are cut to this (header original-bytes)",
                                      low=1024)
    create_topics: bool = _key(False, "create missing output topics at start, with the input's partition count "
                                      "(needs CreateTopics; off: a missing topic stops the start)")
    replication_factor: int = _key(-1, "replicas of the topics create_topics makes (-1: the broker's "
                                       "default.replication.factor)", low=-1)


@dataclass(frozen=True)
class SigningSection:
    shingle: str = _key("word", "word k-grams or character n-grams", choices=("word", "char"))
    k: int = _key(3, "words (or characters) per shingle", low=1, high=64)
    num_perm: int = _key(128, "MinHash signature length", low=2, high=1024)
    seed: int = _key(1, "seed of the MinHash permutations", low=0)


@dataclass(frozen=True)
class LshSection:
    threshold: float = _key(0.7, "exact Jaccard at or above which a document is a duplicate", low=0.01, high=0.99)
    recall: float = _key(0.998, "share of pairs at exactly the threshold that become candidates, when bands x rows "
                         "are chosen (0: choose by fp_weight and fn_weight instead)", low=0.0, high=0.99999)
    fp_weight: float = _key(0.1, "with recall = 0: weight of false positives when choosing bands x rows", low=0.0,
                            high=1.0)
    fn_weight: float = _key(0.9, "with recall = 0: weight of false negatives when choosing bands x rows", low=0.0,
                            high=1.0)
    bands: int = _key(0, "bands (0: chosen from threshold and recall; an existing index keeps its own)", low=0)
    rows: int = _key(0, "rows per band (0: chosen with bands)", low=0)
    min_shared_bands: int = _key(0, "bands a kept document must share with a document to be verified against it "
                                 "(0: chosen with bands)", low=0)
    max_candidates: int = _key(100, "verify at most this many candidates per document; a band key proposes at most "
                                    "this many (its earliest)", low=1)
    cap: str = _key("kept", "what a band key's max_candidates counts: its earliest kept documents (kept), or its "
                    "first probers, duplicates too (probes: what the key proposes depends on the order alone, which "
                    "a deployment splitting the band tables by key needs; a duplicate then stores its places)",
                    choices=("kept", "probes"))


@dataclass(frozen=True)
class TemplatesSection:
    enabled: bool = _key(True, "leave each site's template (and templates shared by many sites) out of its pages' content")
    sample_pages: int = _key(8, "new pages of a site sampled to learn its template", low=2, high=1000)
    share: float = _key(0.5, "a shingle on more than this share of the sampled pages is template", low=0.0, high=0.99)
    relearn_every: int = _key(200, "new pages of a site between two relearning samples (0: learn once)", low=0)
    min_sites: int = _key(3, "a shingle in this many sites' templates is template on every page", low=1)
    min_content_share: float = _key(0.05, "a page with less content than this share of its shingles is compared "
                                    "whole", low=0.0, high=1.0)
    learn_without_url: bool = _key(False, "pages without a URL form one site whose template is learned too")
    window: int = _key(0, "recent new pages of a site where blocks repeated on many of its pages are looked for "
                       "(0: none; try 16)", low=0, high=64)
    min_pages: int = _key(3, "a block on this many of those pages (the new one included) is template", low=2)
    min_block: int = _key(8, "shingles on exactly the same pages of the window that make a block", low=1)
    repeats: bool = _key(True, "a pair of pages of two sites is compared without each page's extra text that is on "
                         "other pages of its own site (its next/previous titles, its table of contents)")
    own_text: bool = _key(True, "with repeats: a page more than a third of whose content is text its site repeats is "
                          "also looked up by the rest (its own text), and is a near duplicate of a page its own text "
                          "is a near duplicate of")
    lines: bool = _key(True, "with repeats and excerpts: a page's containment in an earlier one is also measured "
                       "without the text its site repeats in its short lines (a host page's table of contents, "
                       "its neighbours' titles)")


@dataclass(frozen=True)
class ExcerptsSection:
    enabled: bool = _key(False, "record a document mostly contained in one earlier kept document as its excerpt")
    containment: float = _key(0.8, "share of a document's content found in the earlier one to be its excerpt",
                              low=0.5, high=1.0)
    min_shingles: int = _key(50, "documents with less content (shingles) are never excerpts", low=5)
    sampling: int = _key(8, "one content shingle in this many is an anchor that finds excerpts' sources", low=1,
                         high=1024)
    max_postings: int = _key(32, "documents an anchor holds (the earliest); a commoner anchor finds no more", low=1)


@dataclass(frozen=True)
class IndexSection:
    path: str = _key("state", "folder of the LMDB index (relative to the working directory)")
    map_size_mb: int = _key(1024, "initial LMDB map size in MiB; grows by itself when full (and when a writer "
                            "opens it less than a quarter free)", low=1)
    sync: bool = _key(True, "fsync every commit (false loses the last commits at power loss)")
    merge_every: int = _key(100000, "documents between merges of recent lookup keys into the tables", low=1)
    band_filter_mb: int = _key(32, "MiB of the writer's filter of stored band keys to start with (0: none); its "
                               "filter of the id and content tables' hashes starts at 1/32 of it", low=0)
    band_filter_max_mb: int = _key(1024, "MiB the filter may grow to, in layers, as the index grows (a band entry "
                                   "takes 1.5 bytes of its first layer, about 2.8 of a later run's: 64 MiB a "
                                   "million documents; past this only its false positives rise; the hash filter "
                                   "may grow to 1/16 of it)", low=0)
    retention_days: float = _key(0.0, "kept documents older than this stop matching (0: keep forever)", low=0.0)
    sweep_interval_s: float = _key(600.0, "seconds between retention sweeps of the band tables", low=1.0)


@dataclass(frozen=True)
class WorkerSection:
    batch_size: int = _key(2000, "records decided per batch and per commit", low=1, high=100000)
    poll_timeout_ms: int = _key(500, "longest wait for a batch to fill", low=1)
    transactional_id: str = _key("", "Kafka transactional id ('' derives it from the index id)")
    prepare_processes: int = _key(1, "second process that reads and signs the next batch while one is decided "
                                  "(0: none; dedup then signs on a thread)", low=0, high=1)
    kafka_timeout_s: float = _key(60.0, "longest wait for the broker in one step of a batch's Kafka transaction; "
                                  "then the session is rebuilt and the batch recovered", low=1.0)
    stall_timeout_s: float = _key(300.0, "/healthz fails once one step has waited this long, so an orchestrator "
                                  "restarts the worker (0: never)", low=0.0)
    unreachable_timeout_s: float = _key(300.0, "with --until-caught-up: stop with an error when no broker answered "
                                        "for this long (0: wait forever)", low=0.0)


@dataclass(frozen=True)
class ShardsSection:
    count: int = _key(0, "virtual shards of a sharded deployment (run --role sign / vshards), fixed when it is made "
                         "(0: the single worker)", low=0, high=256)
    signed_topic: str = _key("streamdedup-signed", "internal order topic (1 partition: the decision order); the records "
                             "go to this name + \"-values\" (one partition per vshard)")
    evidence_topic: str = _key("streamdedup-evidence", "internal exchange topic of the vshards' messages to each other "
                               "(one partition per vshard)")
    epoch_records: int = _key(40000, "records of one epoch at most (a signing process fills one for a tenth of a "
                              "second, longer while its input is behind, so a light stream makes small ones; larger ones "
                              "cost the vshards less a document, and make each record wait longer)", low=1, high=1000000)
    batch_bytes: int = _key(8 << 20, "record bytes in an epoch per vshard at most (a larger record travels alone; "
                            "a vshard's records of an epoch are one message, which the internal topics take up to "
                            "64 MiB)", low=1 << 16, high=32 << 20)


@dataclass(frozen=True)
class MetricsSection:
    enabled: bool = _key(True, "serve /metrics, /healthz and /readyz while the worker runs")
    address: str = _key("127.0.0.1:9464", "host:port of that server (0.0.0.0:9464 to reach it from outside)")


@dataclass(frozen=True)
class LogSection:
    format: str = _key("text", "key=value text or JSON lines", choices=("text", "json"))
    level: str = _key("info", "least severe level logged", choices=("debug", "info", "warning", "error"))
    summary_interval_s: float = _key(10.0, "seconds between batch summary lines (0: every batch)", low=0.0)


SECTIONS: dict[str, type] = {
    "kafka": KafkaSection,
    "input": InputSection,
    "output": OutputSection,
    "signing": SigningSection,
    "lsh": LshSection,
    "templates": TemplatesSection,
    "excerpts": ExcerptsSection,
    "index": IndexSection,
    "worker": WorkerSection,
    "shards": ShardsSection,
    "metrics": MetricsSection,
    "log": LogSection,
}
_PASSTHROUGH = {"consumer", "producer"}  # [kafka.consumer], [kafka.producer]
_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
               dict: "a table"}


@dataclass(frozen=True)
class Config:
    kafka: KafkaSection = field(default_factory=KafkaSection)
    input: InputSection = field(default_factory=InputSection)
    output: OutputSection = field(default_factory=OutputSection)
    signing: SigningSection = field(default_factory=SigningSection)
    lsh: LshSection = field(default_factory=LshSection)
    templates: TemplatesSection = field(default_factory=TemplatesSection)
    excerpts: ExcerptsSection = field(default_factory=ExcerptsSection)
    index: IndexSection = field(default_factory=IndexSection)
    worker: WorkerSection = field(default_factory=WorkerSection)
    shards: ShardsSection = field(default_factory=ShardsSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    log: LogSection = field(default_factory=LogSection)


def load(path: Optional[str] = None, overrides: tuple[str, ...] = (), environ: Optional[Mapping[str, str]] = None) -> Config:
    """The configuration from ``path`` (optional), the environment and ``section.key=value`` overrides."""
    raw: dict[str, dict] = {}
    if path:
        raw = _read_toml(path)
    environ = os.environ if environ is None else environ
    for (section, key), value in _from_environment(environ).items():
        raw.setdefault(section, {})[key] = value
    for item in overrides:
        section, key, value = _parse_override(item)
        raw.setdefault(section, {})[key] = value
    unknown = set(raw) - set(SECTIONS)
    if unknown:
        name = sorted(unknown)[0]
        raise ConfigError(f"unknown section [{name}]{_nearest(name, SECTIONS)}; sections are {', '.join(SECTIONS)}")
    config = Config(**{name: _build(name, raw.get(name, {})) for name in SECTIONS})
    _check_across_sections(config)
    return config


def with_values(config: Config, values: Mapping[str, Mapping[str, Any]]) -> Config:
    """``config`` with ``values`` ({section: {key: value}}, Python values) over it, checked as a file's are."""
    unknown = set(values) - set(SECTIONS)
    if unknown:
        name = sorted(unknown)[0]
        raise ConfigError(f"unknown section {name!r}{_nearest(name, SECTIONS)}; sections are {', '.join(SECTIONS)}")
    built = {}
    for name in SECTIONS:
        section, given = getattr(config, name), values.get(name)
        if not given:
            built[name] = section
            continue
        if not isinstance(given, Mapping):
            raise ConfigError(f"section {name!r} takes a dict of its keys, e.g. {name}={{...}}, "
                              f"not a {type(given).__name__}")
        current = {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
        built[name] = _build(name, {**current, **given})
    merged = Config(**built)
    _check_across_sections(merged)
    return merged


def _read_toml(path: str) -> dict:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist; pass --config with an existing file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path!r} is not valid TOML: {exc}") from None


def _from_environment(environ: Mapping[str, str]) -> dict[tuple[str, str], Any]:
    found = {}
    for name, value in environ.items():
        if not name.startswith("STREAMDEDUP_") or name.startswith("STREAMDEDUP_TEST_"):
            continue
        rest = name[len("STREAMDEDUP_"):].lower()
        section = next((s for s in SECTIONS if rest.startswith(s + "_")), None)
        if section is None:
            raise ConfigError(f"environment variable {name} names no section; use STREAMDEDUP_<SECTION>_<KEY> "
                              f"with a section of: {', '.join(SECTIONS)}")
        found[(section, rest[len(section) + 1:])] = _parse_value(value)
    return found


def _parse_override(item: str) -> tuple[str, str, Any]:
    name, sep, value = item.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not key:
        raise ConfigError(f"--set {item!r}: expected section.key=value, for example --set lsh.threshold=0.8")
    return section, key, _parse_value(value.strip())


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _build(section: str, values: dict) -> Any:
    cls = SECTIONS[section]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    checked = {}
    for key, value in values.items():
        if section == "kafka" and key in _PASSTHROUGH:
            checked[key] = _kafka_table(f"kafka.{key}", value, key)
            continue
        if key not in fields:
            if section == "kafka" and key in _kafka_names():
                checked.setdefault("_extra", {})[key] = value
                continue
            options = set(fields) | (_kafka_names() if section == "kafka" else set())
            raise ConfigError(f"unknown key {key!r} in [{section}]{_nearest(key, options)}")
        checked[key] = _checked(section, fields[key], value)
    extra = checked.pop("_extra", None)
    if extra:  # a setting under [kafka] goes to each client that has it (a consumer's alone: to the consumer)
        for client in _PASSTHROUGH:
            own = {k: v for k, v in extra.items() if k in _kafka_names(client)}
            checked[client] = {**own, **checked.get(client, {})}
    built = cls(**checked)
    _check_rules(section, built)
    return built


def _checked(section: str, spec: dataclasses.Field, value: Any) -> Any:
    where = f"{section}.{spec.name}"
    expected = _TYPES[spec.type]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if expected is list and isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(f"{where} must be {_TYPE_NAMES[expected]}, got {value!r} ({type(value).__name__})")
    meta = spec.metadata
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(f"{where} must be one of {', '.join(map(repr, meta['choices']))}, got {value!r}")
    low, high = meta.get("low"), meta.get("high")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise ConfigError(f"{where} must be {bounds}, got {value!r}")
    return value


def _check_rules(section: str, built: Any) -> None:
    """Rules that involve more than one key."""
    if section == "lsh":
        if (built.bands == 0) != (built.rows == 0):
            raise ConfigError("lsh.bands and lsh.rows are set together (both 0 lets streamdedup choose)")
        if built.fp_weight + built.fn_weight <= 0:
            raise ConfigError("lsh.fp_weight and lsh.fn_weight cannot both be 0")
    if section == "output" and built.replication_factor == 0:
        raise ConfigError("output.replication_factor must be -1 (the broker's default.replication.factor) or at "
                          "least 1, got 0")


def _check_across_sections(config: Config) -> None:
    lsh, signing = config.lsh, config.signing
    if lsh.bands and lsh.bands * lsh.rows > signing.num_perm:
        raise ConfigError(
            f"lsh.bands x lsh.rows = {lsh.bands * lsh.rows} exceeds signing.num_perm = {signing.num_perm}; "
            "lower them or raise num_perm"
        )
    given, least = config.kafka.producer.get("delivery_timeout_ms"), least_delivery_ms(config.worker.kafka_timeout_s)
    if given is not None and (not isinstance(given, int) or given < least):
        raise ConfigError(
            f"[kafka.producer] delivery_timeout_ms = {given!r} is below {least} ms (twice worker.kafka_timeout_s and "
            f"{DELIVERY_MARGIN_S:.0f} s more): a batch the producer gave up on could leave a committed transaction "
            "without it. Raise delivery_timeout_ms, lower worker.kafka_timeout_s, or leave it unset")


def least_delivery_ms(kafka_timeout_s: float) -> int:
    """The shortest ``delivery_timeout_ms`` a transactional producer may have (``DELIVERY_MARGIN_S``)."""
    return int((2 * kafka_timeout_s + DELIVERY_MARGIN_S) * 1000)


def transaction_producer_settings(config: Config) -> dict:
    """kafka-python keyword arguments for the transactional producer of the outcomes: the ``producer`` role's,
    with ``delivery_timeout_ms`` at least ``least_delivery_ms`` unless ``[kafka.producer]`` gives it (checked at
    load): kafka-python's own default, 2 minutes, is only the two waits of 1 minute each."""
    settings = kafka_client_settings(config.kafka, "producer")
    settings.setdefault("delivery_timeout_ms", least_delivery_ms(config.worker.kafka_timeout_s))
    return settings


def _kafka_table(where: str, value: Any, client: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"[{where}] must be a table of kafka-python settings")
    names = _kafka_names(client)
    for key in value:
        if key not in names:
            raise ConfigError(f"unknown kafka-python Kafka{client.capitalize()} setting {key!r} in "
                              f"[{where}]{_nearest(key, names)}")
    return dict(value)


def _kafka_names(client: Optional[str] = None) -> set[str]:
    """kafka-python's settings of the ``client`` ("consumer" or "producer"; None: either)."""
    from kafka import KafkaConsumer, KafkaProducer

    consumer, producer = set(KafkaConsumer.DEFAULT_CONFIG), set(KafkaProducer.DEFAULT_CONFIG)
    return {"consumer": consumer, "producer": producer}.get(client, consumer | producer)


def _nearest(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def redacted(config: Config) -> dict:
    """The configuration as a dictionary, secrets replaced by '***'."""
    result = dataclasses.asdict(config)
    for section, cls in SECTIONS.items():
        for spec in dataclasses.fields(cls):
            if spec.metadata.get("secret") and result[section].get(spec.name):
                result[section][spec.name] = "***"
    for table in ("consumer", "producer"):
        for key in result["kafka"][table]:
            if "password" in key:
                result["kafka"][table][key] = "***"
    return result


def kafka_client_settings(kafka: KafkaSection, role: str) -> dict:
    """kafka-python keyword arguments for a ``consumer``, ``producer`` or ``admin``: common settings, then the role's
    table (the admin client has none)."""
    settings: dict[str, Any] = {
        "bootstrap_servers": [s.strip() for s in kafka.bootstrap_servers.split(",") if s.strip()],
        "security_protocol": kafka.security_protocol,
        "client_id": kafka.client_id,
        # kafka-python waits this long before a request it re-queued (100 ms by default), which happens at
        # start as the coordinators and topics are found: it cost about 0.5 s before the first batch.
        "retry_backoff_ms": 20,
    }
    for name in ("sasl_mechanism", "sasl_plain_username", "ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if getattr(kafka, name):
            settings[name] = getattr(kafka, name)
    password = _password(kafka)
    if password:
        settings["sasl_plain_password"] = password
    settings.update({"consumer": kafka.consumer, "producer": kafka.producer}.get(role, {}))
    return settings


def _password(kafka: KafkaSection) -> str:
    if kafka.sasl_plain_password_file:
        try:
            with open(kafka.sasl_plain_password_file, encoding="utf-8") as handle:
                return handle.readline().rstrip("\n")
        except OSError as exc:
            raise ConfigError(f"kafka.sasl_plain_password_file: cannot read it ({exc.strerror})") from None
    return kafka.sasl_plain_password
