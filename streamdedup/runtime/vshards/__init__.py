"""The Kafka side of a deployment whose band tables are split by key (``engine.vshards``): what its internal
topics carry (``messages``) and the process hosting some of its virtual shards (``host``); the signing
processes are the lockstep deployment's (``runtime.shards.sign``) with ``shards.design = "keys"``."""
