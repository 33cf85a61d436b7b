"""streamdedup: streaming, incremental near-duplicate deduplication of text.

Data path, one module per stage: ``source`` -> ``decode`` -> ``shingle`` ->
``signing`` -> ``lsh`` / ``index`` -> ``verify`` -> ``decide`` -> ``sink``;
``checkpoint`` holds the commit protocols, ``engine`` ties index and
settings together, ``offline`` and ``worker`` are the two loops.
"""

__version__ = "0.1.0"
