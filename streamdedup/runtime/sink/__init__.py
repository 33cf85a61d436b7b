"""The sink stage: where outcomes go.

Offline, the clean lines and the decisions file (``files``); for the worker,
the clean, duplicates and dead-letter topics (``messages``: what goes where;
``producer``: one Kafka transaction per batch, with the input offsets;
``admin``: the topics' limits; ``partitioner``; ``appender``: the record
accumulator, fed directly).
"""

from .files import FileOutputs, decision_line
from .producer import KafkaSink, Pending

__all__ = ["FileOutputs", "KafkaSink", "Pending", "decision_line"]
