"""The engine of a sharded deployment: what a shard knows of a batch, and the decisions every shard agrees on.

A sharded index is ``count`` ordinary indexes. Shard ``i`` holds the
documents whose id hash is ``i`` modulo ``count`` (``ShardPlace.owns``): their
records, shingles and band entries. Serials are numbered for the whole
deployment, so a shard's serials have gaps. Every shard sees every batch,
in one order, and for each batch:

1. looks the batch up in its own tables (``engine.evidence``): the
   earlier decision of a replayed document it owns, the first document of
   each content it holds, the (band key, serial) entries it holds under the
   batch's band keys, and the exact Jaccard of every candidate of its own at
   or above the threshold;
2. takes every shard's evidence and decides the batch with
   ``engine.decide.decide_together``, the function a single worker decides
   with, on the evidence of every shard instead of one index's: so every
   shard reaches the same decisions, those of a single worker;
3. writes its own documents into its index (``ShardEngine.decide_together``),
   in a prepared transaction the front end commits as a single worker's.
"""
