"""The Kafka side of a sharded deployment (``engine.vshards``): its processes and their internal topics.

- ``sign`` (``run --role sign``): any number of processes in a consumer
  group on the input topics; each poll's records go out as epochs.
- ``host`` (``run --role vshards``): a process hosting some of the virtual
  shards, which the consumer group moves between hosts.
- ``messages``: what the internal topics carry; ``topics``: those topics,
  made when missing.
"""
