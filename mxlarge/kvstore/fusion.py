"""Gradient fusion's bucket plan: which gradients travel together under one key (pure).

Per-key push/pull costs a round trip and a server request per tensor, which dominates
for nets of many small tensors (a BN layer is two tensors of C floats): Horovod's tensor
fusion on a parameter server. :func:`fuse` packs the pushed gradients, in backward
order, into buckets of at most a given size and one dtype; the store
(:class:`mxlarge.kvstore.sync.SyncStore`) makes the members' gradient arrays views of
the bucket's buffer. :func:`spread` picks the buckets' keys so that every server sums as
many of their elements as every other (MXNet sends a key below its big-array bound whole
to one server, chosen by the key). With several servers on several hosts a tensor larger
than ``servers`` buckets travels as pieces of that size (:func:`piece_floats`), so MXNet
slices each over the servers into messages of a bucket's size: a server starts returning
a sum once every worker's piece arrived, not the whole tensor's third (measured on the
testbed, ``make bench-cluster`` rows ``floor_*``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: Key of the first multi-member bucket (``FUSE_KEY + b`` for bucket b).
FUSE_KEY = 150_000


@dataclass(frozen=True)
class Bucket:
    """Gradients that travel as one key: ``members`` (parameter indices, backward order)
    at element ``offsets`` of a flat buffer of ``size`` floats. One member: its own key,
    no buffer (:attr:`alone`), or elements ``offsets[0]`` to ``offsets[0] + size`` of it
    (a piece)."""

    key: int
    members: tuple[int, ...]
    offsets: tuple[int, ...]
    size: int

    @property
    def fused(self) -> bool:
        return len(self.members) > 1

    @property
    def alone(self) -> bool:
        """A whole tensor under its own key (the key that also broadcasts its weight)."""
        return self.key == self.members[0] and not self.fused


def fuse(sizes: Sequence[int], order: Sequence[int], limit: int,
         alone: frozenset[int] = frozenset(),
         kinds: Sequence[str] | None = None, piece: int = 0) -> list[Bucket]:
    """Greedy buckets over the parameters ``order`` (backward order) of ``sizes``
    elements each.

    A parameter of ``limit`` elements or more (or every one when ``limit`` ≤ 0) is a
    bucket of its own under key ``i``, as is every index in ``alone``; the others fill
    buckets in order while their total stays ≤ ``limit`` and their ``kinds`` (dtypes: a
    buffer has one) agree. Buckets come in the order they are complete (a bucket is
    ready when its last member is); bucket ``b`` of several members gets key ``FUSE_KEY
    + b``. With ``piece`` > 0 a lone tensor of more than ``piece`` elements travels as k
    = ⌈n / piece⌉ consecutive pieces of ⌊n / k⌋ elements (the last one takes the rest),
    numbered and keyed as the buckets of several members are.
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
            current = []
            total = 0
        current.append(i)
        total += n
        if total == limit:
            groups.append(current)
            current = []
            total = 0
    if current:
        groups.append(current)
    out = []
    b = 0
    for g in groups:
        offsets = [0]
        for i in g[:-1]:
            offsets.append(offsets[-1] + int(sizes[i]))
        size = offsets[-1] + int(sizes[g[-1]])
        if len(g) == 1 and (piece <= 0 or size <= piece or g[0] in alone):
            out.append(Bucket(g[0], (g[0],), (0,), size))
        elif len(g) == 1:
            k = -(-size // piece)
            for j in range(k):
                n = size // k + (size % k if j == k - 1 else 0)
                out.append(Bucket(FUSE_KEY + b, (g[0],), (j * (size // k),), n))
                b += 1
        else:
            out.append(Bucket(FUSE_KEY + b, tuple(g), tuple(offsets), size))
            b += 1
    return out


def piece_floats(servers: int, limit: int, spans_hosts: bool) -> int:
    """The ``piece`` of :func:`fuse` for a job with ``servers`` and buckets of ``limit``
    floats: ``servers · limit`` (each piece one bucket per server) when its processes
    are on several hosts; 0 (no pieces) with one server or on one machine, where no link
    is to be pipelined and each extra message only costs CPU (2 workers + 2 servers on
    loopback, ResNet-50: 181 ms a push+pull in pieces against 168 ms whole, 152 ms
    MXNet's own one key per tensor)."""
    return servers * limit if servers > 1 and limit > 0 and spans_hosts else 0


def server_of(key: int, servers: int) -> int:
    """The server MXNet 1.9.1 sends a whole key to (an array below
    ``MXNET_KVSTORE_BIGARRAY_BOUND`` elements): ``(key · 9973) mod servers``."""
    return key * 9973 % servers


def spread(buckets: Sequence[Bucket], servers: int, bound: int, limit: int,
           lone_key: Callable[[Bucket], int] | None = None) -> list[Bucket]:
    """``buckets`` with their multi-member buckets re-keyed so that every server
    receives the same elements within one bucket, in every prefix of the push order:
    bucket after bucket, a whole one (below ``bound`` elements) goes to the server with
    the fewest so far (its key: the next free ``FUSE_KEY + j`` below ``FUSE_KEY +
    limit`` that MXNet sends there, :func:`server_of`); a lone tensor goes where the key
    it travels under sends it (``lone_key``, default its own), and an array of ``bound``
    elements or more is sliced evenly over all servers by MXNet (each gets
    size/servers). Members, offsets and order are unchanged: only which server sums a
    bucket changes, not what is summed, so every sum is bitwise the same.
    """
    if servers <= 1:
        return list(buckets)
    load = [0.0] * servers
    used = {b.key for b in buckets if not b.fused}
    nxt = [0] * servers  # next j to try per server
    out = []
    for b in buckets:
        if b.size >= bound:
            load = [x + b.size / servers for x in load]
            key = b.key
        elif not b.fused:
            load[server_of(b.key if lone_key is None else lone_key(b), servers)] += b.size
            key = b.key
        else:
            target = min(range(servers), key=lambda s: (load[s], s))
            j = nxt[target]
            while j < limit and (server_of(FUSE_KEY + j, servers) != target
                                 or FUSE_KEY + j in used):
                j += 1
            if j >= limit:  # no key of this range reaches it (servers sharing 9973's factor)
                raise ValueError(f"no bucket key below {FUSE_KEY + limit} goes to server "
                                 f"{target} of {servers}")
            nxt[target] = j + 1
            key = FUSE_KEY + j
            load[target] += b.size
        used.add(key)
        out.append(Bucket(key, b.members, b.offsets, b.size))
    return out


@dataclass(frozen=True)
class Holders:
    """Which server sums what: ``alone[s]``, the parameters whose whole gradient server s
    sums (waiting for them waits for s and no other server); ``share[s]``, the share of
    the pushed bytes s sums."""

    alone: tuple[tuple[int, ...], ...]
    share: tuple[float, ...]


def holders(buckets: Sequence[Bucket], servers: int, bound: int, key_of: Callable[[Bucket], int],
            nbytes: Callable[[Bucket], int]) -> Holders:
    """Where MXNet 1.9.1 sums each of ``buckets`` (sent under ``key_of(b)``, ``nbytes(b)``
    bytes on the wire): a bucket below ``bound`` elements on :func:`server_of` its key, a
    larger one in equal slices on every server (so its members are no server's
    alone)."""
    load = [0.0] * servers
    where: dict[int, set[int]] = {}
    for b in buckets:
        if servers > 1 and b.size >= bound:
            load = [x + nbytes(b) / servers for x in load]
            held = set(range(servers))
        else:
            s = server_of(key_of(b), servers)
            load[s] += nbytes(b)
            held = {s}
        for m in b.members:
            where.setdefault(m, set()).update(held)
    total = sum(load) or 1.0
    alone = tuple(tuple(sorted(m for m, held in where.items() if held == {s}))
                  for s in range(servers))
    return Holders(alone, tuple(x / total for x in load))
