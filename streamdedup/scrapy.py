"""A Scrapy item pipeline: each scraped page decided where it is crawled.

In the Scrapy project's settings::

    ITEM_PIPELINES = {"streamdedup.scrapy.DedupPipeline": 300}
    STREAMDEDUP_INDEX = "dedup-index"   # decide each page against this index folder (made on first use)
    STREAMDEDUP_ACTION = "drop"         # drop duplicates (the default), or "tag" them and pass them on
    STREAMDEDUP_SETTINGS = {"input": {"html_field": "html"}}   # streamdedup's settings, by section

or, to leave the deciding to a running worker, ``STREAMDEDUP_TOPIC = "crawl"``
(and no index): each page is sent to that Kafka topic as the JSON record the
worker reads, keyed by its id, with the brokers and security of the ``kafka``
section. The settings are Scrapy's, so a spider or ``scrapy crawl -s`` can set
them too:

- ``STREAMDEDUP_INDEX`` or ``STREAMDEDUP_TOPIC``: where pages go (one of the two);
- ``STREAMDEDUP_ACTION``: ``drop`` or ``tag`` (with an index);
- ``STREAMDEDUP_TAG_FIELD``: the field a tagged page gets (``streamdedup``): status,
  cluster, matched, similarity, relation and reason of its decision;
- ``STREAMDEDUP_CONFIG``: a ``config.toml``; ``STREAMDEDUP_SETTINGS``: sections
  over it, as ``streamdedup.open`` takes them.

A page is read as ``dedup`` reads a JSON record (``input.id_field``,
``text_field``, ``url_field``, ``html_field``: a page's HTML gives its main
content); a page that cannot be read (no text, no id) is passed on, tagged
with the reason, never dropped: nothing is lost for a malformed item. The
crawl's stats count ``streamdedup/kept``, ``streamdedup/duplicate``,
``streamdedup/exact``, ``streamdedup/dropped``, ``streamdedup/rejected``,
``streamdedup/sent`` (the broker has the page) and ``streamdedup/send_failed``
(it never took the page: logged as an error with the topic, partition and
what to do; the item itself is passed on, since it was scraped). Each page is committed as it comes (``Index.add_many``
of one): set ``{"index": {"sync": False}}`` for a crawl that can be redone.

Needs the ``scrapy`` extra: ``pip install 'streamdedup[scrapy]'``.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from typing import Optional

from itemadapter import ItemAdapter
from scrapy.exceptions import DropItem, NotConfigured

from . import api
from . import config as config_module
from .core.decode import field_at
from .errors import ConfigError, write_advice

__all__ = ["DedupPipeline"]

ACTIONS = ("drop", "tag")
log = logging.getLogger(__name__)


class DedupPipeline:
    """Decides each scraped item against a local index (dropping or tagging duplicates), or sends it to the
    worker's input topic."""

    def __init__(self, settings, stats=None):
        self.index_path: Optional[str] = settings.get("STREAMDEDUP_INDEX")
        self.topic: Optional[str] = settings.get("STREAMDEDUP_TOPIC")
        if not self.index_path and not self.topic:
            raise NotConfigured("set STREAMDEDUP_INDEX (an index folder to decide pages against) or "
                                "STREAMDEDUP_TOPIC (the worker's input topic to send them to)")
        if self.index_path and self.topic:
            raise ConfigError("set one of STREAMDEDUP_INDEX and STREAMDEDUP_TOPIC, not both: pages are decided "
                              "here or by the worker")
        self.action = settings.get("STREAMDEDUP_ACTION", "drop")
        if self.action not in ACTIONS:
            raise ConfigError(f"STREAMDEDUP_ACTION must be one of {', '.join(map(repr, ACTIONS))}, "
                              f"got {self.action!r}")
        self.tag_field = settings.get("STREAMDEDUP_TAG_FIELD", "streamdedup")
        sections = settings.getdict("STREAMDEDUP_SETTINGS")
        self.config = api.config_of(settings.get("STREAMDEDUP_CONFIG"), sections)
        self.stats = stats
        self.index: Optional[api.Index] = None
        self.producer = None
        # Sends done (None: taken, or kafka-python's error with the page's partition), appended on the producer's
        # thread and counted on Scrapy's (``_count_sends``).
        self.outcomes: deque = deque()
        self.failures = 0

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler.settings, crawler.stats)

    def open_spider(self, spider) -> None:
        if self.index_path:
            self.index = api.open(self.index_path, self.config)
        else:
            self.producer = _producer(self.config)

    def close_spider(self, spider) -> None:
        if self.index is not None:
            self.index.close()
            self.index = None
        if self.producer is not None:
            self.producer.flush()
            self._count_sends()
            self.producer.close()
            self.producer = None
            if self.failures:
                log.error("streamdedup: %d page(s) were not sent to %s (streamdedup/send_failed); the errors above "
                          "say why", self.failures, self.topic)

    def process_item(self, item, spider):
        adapter = ItemAdapter(item)
        record = adapter.asdict()
        if self.producer is not None:
            self._count_sends()
            return self._sent(item, record)
        decision = self.index.add_many([record])[0]
        self._count(decision.status)
        if decision.exact:
            self._count("exact")
        if decision.status == "duplicate" and self.action == "drop":
            self._count("dropped")
            raise DropItem(f"a {decision.relation} duplicate of {decision.matched} (cluster {decision.cluster})")
        if decision.status == "rejected" or self.action == "tag":
            _tag(adapter, self.tag_field, {"status": decision.status, "cluster": decision.cluster,
                                           "matched": decision.matched, "similarity": decision.similarity,
                                           "relation": decision.relation, "reason": decision.reason})
        return item

    def _sent(self, item, record: dict):
        """The item as the worker reads it, to the input topic, keyed by its id (the partitioner's order)."""
        key = field_at(record, self.config.input.id_field)
        future = self.producer.send(self.topic, key=None if key is None else str(key).encode(),
                                    value=json.dumps(record, default=str).encode())
        future.add_callback(lambda _: self.outcomes.append(None))
        future.add_errback(lambda error: self.outcomes.append((key, error, future)))
        return item

    def _count_sends(self) -> None:
        """Count the sends the broker answered since the last call: ``sent``, or ``send_failed`` with an error
        logged (kafka-python's producer only logs a failed batch, and its ``flush`` does not raise for one)."""
        while self.outcomes:
            failed = self.outcomes.popleft()
            if failed is None:
                self._count("sent")
                continue
            key, error, future = failed
            tp = getattr(getattr(future, "_produce_future", None), "topic_partition", None)
            self.failures += 1
            self._count("send_failed")
            text = str(error)
            log.error("streamdedup: page %s was not sent to %s partition %s (%s); %s", key, self.topic,
                      "?" if tp is None else tp.partition,
                      text if type(error).__name__ in text else f"{type(error).__name__}: {text}",
                      write_advice(error, self.topic) or "the broker did not take it in the producer's "
                      "delivery_timeout_ms (is it running?): crawl the page again")

    def _count(self, what: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(f"streamdedup/{what}")


def _tag(adapter: ItemAdapter, field: str, value: dict) -> None:
    try:
        adapter[field] = value
    except KeyError:
        raise ConfigError(f"the item class {type(adapter.item).__name__} has no field {field!r}: declare it "
                          f"(scrapy.Field()) or set STREAMDEDUP_TAG_FIELD to one it has") from None


def _producer(config: config_module.Config):
    """A producer with the ``kafka`` section's brokers, security and producer table (waiting for every
    replica: a page sent is a page the worker will read)."""
    from kafka import KafkaProducer

    return KafkaProducer(**{**config_module.kafka_client_settings(config.kafka, "producer"), "acks": "all"})
