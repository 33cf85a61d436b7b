"""The front ends: where records come from (``source``, ``feed``), where outcomes go (``sink``),
where input positions move (``checkpoint``), and the loops that tie them (``offline``, ``worker``).
"""
