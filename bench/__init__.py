"""Benchmarks: run each from the repository's top folder as a module, ``python -m bench.NAME`` (``bench.harness``)."""
