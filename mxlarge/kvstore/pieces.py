"""A tensor's gradient pieces (:func:`mxlarge.kvstore.fusion.fuse`) exchanged
concurrently.

MXNet's engine orders operations by variable, and a slice of an NDArray shares its
variable: a push-pull writes the array it sends (on CPU it receives into it), so the
pieces of one tensor, sent as slices, would each wait for the previous piece's sum to
come back (measured: docs/design/sync.md, "A tensor's pieces"). Each piece is exchanged
instead through an alias of its memory with a variable of its own (DLPack), and two
one-element copies link the aliases to the gradient's variable: each piece's copy in
reads the gradient (so it follows backward), its copy out writes it (so the update and
the next backward follow the sum). An element copied onto itself changes no bit.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import mxnet as mx

from mxlarge.kvstore.fusion import Bucket


class PieceLinks:
    """Per piece bucket, per device: ``(alias, first element of the gradient's slice,
    first element of the alias)``, rebuilt when Gluon replaces the gradient arrays."""

    def __init__(self) -> None:
        self._links: dict[int, tuple[list[mx.nd.NDArray], list[tuple[mx.nd.NDArray, ...]]]] = {}

    def _of(self, b: Bucket, grads: Sequence[mx.nd.NDArray]) -> list[tuple[mx.nd.NDArray, ...]]:
        held = self._links.get(b.key)
        if held is not None and len(held[0]) == len(grads) and all(
                g is h for g, h in zip(grads, held[0])):
            return held[1]
        lo = b.offsets[0]
        hi = b.offsets[0] + b.size
        links = []
        for g in grads:
            view = g.reshape((-1,))[lo:hi]
            alias = mx.nd.from_dlpack(mx.nd.to_dlpack_for_write(view))  # keeps `view` alive
            links.append((alias, view[0:1], alias[0:1]))
        self._links[b.key] = (list(grads), links)
        return links

    def exchange(self, pieces: Sequence[Bucket], grads: Sequence[mx.nd.NDArray],
                 exchange: Callable[[Bucket, list[mx.nd.NDArray]], None]) -> None:
        """``exchange(piece, its arrays per device)`` for every piece of one tensor
        whose gradients per device are ``grads``: every copy in, every exchange, every
        copy out, in that order, so that no piece waits for another."""
        links = [self._of(b, grads) for b in pieces]
        for per_device in links:
            for _, head, alias_head in per_device:
                head.copyto(alias_head)
        for b, per_device in zip(pieces, links):
            exchange(b, [alias for alias, _, _ in per_device])
        for per_device in links:
            for _, head, alias_head in per_device:
                alias_head.copyto(head)
