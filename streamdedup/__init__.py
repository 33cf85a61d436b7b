"""streamdedup: streaming, incremental near-duplicate deduplication of text.

Data path, one module per stage: ``source`` -> ``prepare`` (``decode``,
``shingle``, ``signing``, ``lsh``) -> ``decide`` (``index``, ``lookup``,
``verify``) -> ``sink``;
``checkpoint`` holds the commit protocols, ``engine`` ties index and
settings together, ``offline`` and ``worker`` are the two loops.
"""

__version__ = "0.1.0"
