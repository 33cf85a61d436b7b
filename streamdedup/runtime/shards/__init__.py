"""The Kafka side of a sharded deployment: signing processes, shard processes, and their internal topics.

- ``sign``: any number of processes in a consumer group on the input topics;
  each batch it reads goes out signed, as one message, to the signed topic
  (one partition: its order is the deployment's decision order).
- ``shard``: one process per shard. Every shard reads every signed batch,
  publishes its evidence on it (``engine.shards``) to its partition of the
  evidence topic, reads every shard's evidence for the batch, decides it as
  every shard does, writes its own documents and sends their outcomes out,
  with the single worker's commit protocol (``shard.ShardCommit``).
- ``topics``: the two internal topics, made when missing.
"""
