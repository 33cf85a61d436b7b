"""The on-disk index: LMDB tables, transactions, lookups, the band filter, housekeeping, the check.

The only layer that imports ``lmdb``.
"""
