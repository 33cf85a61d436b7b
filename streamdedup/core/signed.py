"""Forget orders as they travel in a sharded deployment's decision order.

A forget order (``pack_forget``) goes into the order topic between two
epochs, where every vshard meets it at the same place in the decision order.
(The signing processes sent what preparing made of each record with it up to
the messages' format 4; since format 5 each home prepares its own records:
``runtime.vshards.messages``.)
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

__all__ = ["ForgetOrder", "pack_forget"]

_FORGET_FORMAT = 2  # the first field of a forget order, as the deployments before wrote it too


@dataclass
class ForgetOrder:
    """Ids to forget, at their place in the decision order (``streamdedup forget`` on a sharded deployment)."""

    ids: list[str]


def pack_forget(ids: list[str]) -> bytes:
    return msgpack.packb([_FORGET_FORMAT, "forget", list(ids)], use_bin_type=True)
