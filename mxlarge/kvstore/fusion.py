"""Gradient fusion's bucket plan: which gradients travel together under one key (pure).

Per-key push/pull costs a round trip and a server request per tensor, which dominates for nets
of many small tensors (a BN layer is two tensors of C floats): Horovod's tensor fusion on a
parameter server. :func:`fuse` packs the pushed gradients, in backward order, into buckets of
at most a given size and one dtype; the store (:class:`mxlarge.kvstore.sync.SyncStore`) makes
the members' gradient arrays views of the bucket's buffer.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Key of the first multi-member bucket (``FUSE_KEY + b`` for bucket b).
FUSE_KEY = 150_000


@dataclass(frozen=True)
class Bucket:
    """Gradients that travel as one key: ``members`` (parameter indices, backward order) at
    element ``offsets`` of a flat buffer of ``size`` floats. One member: its own key, no buffer."""

    key: int
    members: tuple[int, ...]
    offsets: tuple[int, ...]
    size: int

    @property
    def fused(self) -> bool:
        return len(self.members) > 1


def fuse(sizes: Sequence[int], order: Sequence[int], limit: int,
         alone: frozenset[int] = frozenset(),
         kinds: Sequence[str] | None = None) -> list[Bucket]:
    """Greedy buckets over the parameters ``order`` (backward order) of ``sizes`` elements each.

    A parameter of ``limit`` elements or more (or every one when ``limit`` ≤ 0) is a bucket of
    its own under key ``i``, as is every index in ``alone``; the others fill buckets in order
    while their total stays ≤ ``limit`` and their ``kinds`` (dtypes: a buffer has one) agree.
    Buckets come in the order they are complete (a bucket
    is ready when its last member is); bucket ``b`` of several members gets key
    ``FUSE_KEY + b``.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i in order:
        n = int(sizes[i])
        if limit <= 0 or n >= limit or i in alone:
            groups.append([i])
            continue
        if current and (total + n > limit
                        or (kinds is not None and kinds[i] != kinds[current[0]])):
            groups.append(current)
            current, total = [], 0
        current.append(i)
        total += n
        if total == limit:
            groups.append(current)
            current, total = [], 0
    if current:
        groups.append(current)
    out, b = [], 0
    for g in groups:
        offsets = [0]
        for i in g[:-1]:
            offsets.append(offsets[-1] + int(sizes[i]))
        size = offsets[-1] + int(sizes[g[-1]])
        if len(g) == 1:
            out.append(Bucket(g[0], (g[0],), (0,), size))
        else:
            out.append(Bucket(FUSE_KEY + b, tuple(g), tuple(offsets), size))
            b += 1
    return out
