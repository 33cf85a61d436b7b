"""The engine of a sharded deployment: what a shard knows of a batch, and the decisions every shard agrees on.

A sharded index is ``count`` ordinary indexes. Shard ``i`` holds the
documents whose id hash is ``i`` modulo ``count`` (``ShardPlace.owns``): their
records, shingles and band entries. Serials are numbered for the whole
deployment, so a shard's serials have gaps. Every shard sees every batch,
in one order, and for each batch:

1. looks the batch up in its own tables (``evidence.evidence_of``): the
   earlier decision of a replayed document it owns, the first document of
   each content it holds, the (band key, serial) entries it holds under the
   batch's band keys, and the exact Jaccard of every candidate of its own at
   or above the threshold;
2. takes every shard's evidence and decides the batch with
   ``together.decide_together``, a pure function of the batch and the
   evidence, so every shard reaches the same decisions, the same a single
   index would (``engine.decide``): evidence and the batch's own documents
   stand in for the one index's lookups;
3. writes its own documents into its index (``ShardEngine.decide``), in a
   prepared transaction the front end commits as a single worker's.
"""
