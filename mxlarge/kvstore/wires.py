"""What travels between workers and servers: one exchange strategy per job, chosen once.

As DDP's communication hooks do for PyTorch, a :class:`Wire` decides what a bucket's
gradients become on the wire and what comes back. The store
(:class:`mxlarge.kvstore.sync.SyncStore`) moves whatever the wire hands it, and never
branches on which wire it is.

* :class:`Float32Wire`: every gradient travels in its own dtype (float32, or float16 for
  float16 weights). The servers sum.
* :class:`Float16Wire`: float32 gradients travel as s·g in float16 and come back as float32 (s:
  the AMP-unscaled ``rescale_grad``, so the range does not depend on AMP's loss scale). The
  servers sum in float32 (MXNet's multi-precision command), so each element is within
  2⁻¹¹·(Σ|x| + |Σx|) + (k+1)·2⁻²⁵ of the exact sum. Half the bytes.
* :class:`TwoBitWire`: MXNet's 2-bit compression (each element as 0 or ±t, the rest kept as a
  residual on the worker). A compressed push and its pull must be two calls, and a gathered
  float travels as its 32 bits, each 0 or t.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mxnet as mx
import numpy as np

from mxlarge.kvstore.fusion import Bucket

WIRE_DTYPES = ("float32", "float16")
#: A lone float32 gradient's float16 key is ``WIRE_KEY + i``: its own key ``i`` holds
#: the float32 weight of the initial broadcast.
WIRE_KEY = 50_000


def check_wire_dtype(wire_dtype: str) -> None:
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"wire_dtype {wire_dtype!r}: expected one of {', '.join(WIRE_DTYPES)}")


class Wire:
    """The exchange strategy's interface; itself the plain one (:class:`Float32Wire`).

    Attributes:
        split: a push and its pull must be two calls (no ``pushpull``).
        compressed: a gathered float travels as its 32 bits (:meth:`gather_slot`).
        half: float32 gradients travel as float16 (the servers must sum 16-bit pushes in
            float32).
    """

    split = False
    compressed = False
    half = False

    def carries(self, bucket: Bucket, dtype: str) -> bool:
        """Whether ``bucket`` (of ``dtype``) travels in buffers of the wire's own."""
        return False

    def key(self, bucket: Bucket) -> int:
        """The key the bucket's sums travel under."""
        return bucket.key

    def itemsize(self, bucket: Bucket, dtype: str) -> int:
        """Bytes per element of ``bucket`` on the wire."""
        return np.dtype(dtype).itemsize

    def prepare(self, bucket: Bucket, shape: tuple[int, ...], dtype: str,
                contexts: Sequence[Any]) -> None:
        """Makes the wire's buffers of ``bucket`` (one per device), if it has any."""

    def init_value(self, bucket: Bucket, shape: tuple[int, ...], dtype: str) -> mx.nd.NDArray:
        """The value that initialises ``bucket``'s key on the servers."""
        return mx.nd.zeros(shape, dtype=dtype)

    def outbound(self, bucket: Bucket, arrays: list[mx.nd.NDArray],
                 prescale: float) -> list[mx.nd.NDArray]:
        """The arrays that travel for ``arrays`` (one per device)."""
        return arrays

    def inbound(self, bucket: Bucket, arrays: list[mx.nd.NDArray], sent: list[mx.nd.NDArray],
                prescale: float) -> None:
        """Writes the sums that came back in ``sent`` into ``arrays``."""

    def prescale(self, given: float) -> float:
        """The factor gradients are scaled by on the wire, for ``given`` (s)."""
        return 1.0

    def gather_slot(self, mine: np.ndarray) -> np.ndarray:
        """What rank r writes into its slot of an exact gather, for its float32 ``mine``."""
        return mine

    def gather_rows(self, rows: np.ndarray, n: int) -> np.ndarray:
        """The ranks' float32 vectors of length ``n`` back from the pulled ``rows``."""
        return rows


class Float32Wire(Wire):
    """Every gradient in its own dtype (module docstring)."""


class Float16Wire(Wire):
    """float32 gradients as s·g in float16 (module docstring)."""

    half = True

    def __init__(self) -> None:
        self.buffers: dict[int, list[mx.nd.NDArray]] = {}  # bucket key -> float16 per device

    def carries(self, bucket: Bucket, dtype: str) -> bool:
        return dtype == "float32"

    def key(self, bucket: Bucket) -> int:
        if bucket.alone and bucket.key in self.buffers:
            return WIRE_KEY + bucket.key
        return bucket.key

    def itemsize(self, bucket: Bucket, dtype: str) -> int:
        if self.carries(bucket, dtype):
            return 2
        return np.dtype(dtype).itemsize

    def prepare(self, bucket: Bucket, shape: tuple[int, ...], dtype: str,
                contexts: Sequence[Any]) -> None:
        if self.carries(bucket, dtype):
            self.buffers[bucket.key] = [mx.nd.zeros(shape, ctx=c, dtype="float16")
                                        for c in contexts]

    def init_value(self, bucket: Bucket, shape: tuple[int, ...], dtype: str) -> mx.nd.NDArray:
        if self.carries(bucket, dtype):
            return mx.nd.zeros(shape, dtype="float16")
        return mx.nd.zeros(shape, dtype=dtype)

    def outbound(self, bucket: Bucket, arrays: list[mx.nd.NDArray],
                 prescale: float) -> list[mx.nd.NDArray]:
        wire = self.buffers.get(bucket.key)
        if wire is None:
            return arrays
        for a, w in zip(arrays, wire):
            scaled = a * prescale if prescale != 1.0 else a
            mx.nd.cast(scaled, dtype="float16", out=w)
        return wire

    def inbound(self, bucket: Bucket, arrays: list[mx.nd.NDArray], sent: list[mx.nd.NDArray],
                prescale: float) -> None:
        if sent is arrays:
            return
        for a, w in zip(arrays, sent):
            mx.nd.cast(w, dtype="float32", out=a)
            if prescale != 1.0:
                a *= 1.0 / prescale

    def prescale(self, given: float) -> float:
        if np.isfinite(given) and given:
            return float(given)
        return 1.0


class TwoBitWire(Wire):
    """MXNet's 2-bit compression with threshold ``threshold`` (module docstring)."""

    split = True
    compressed = True

    def __init__(self, threshold: float) -> None:
        self.threshold = float(np.float32(threshold))

    def gather_slot(self, mine: np.ndarray) -> np.ndarray:
        bits = np.unpackbits(mine.view(np.uint8))
        return bits.astype(np.float32) * self.threshold

    def gather_rows(self, rows: np.ndarray, n: int) -> np.ndarray:
        bits = (rows > self.threshold / 2).astype(np.uint8)
        return np.packbits(bits, axis=1).view(np.float32).reshape(rows.shape[0], n)


def wire_for(distributed: bool, wire_dtype: str, compression: dict | None) -> Wire:
    """The job's wire, or the reason it cannot have it.

    Raises:
        ValueError: an unknown wire dtype or compression, either of them without a dist
            store, or both at once.
    """
    check_wire_dtype(wire_dtype)
    if compression:
        if not distributed:
            raise ValueError("gradient compression needs a dist kvstore")
        if compression.get("type") != "2bit":
            raise ValueError(f"gradient compression {compression.get('type')!r}: only "
                             "'2bit' is supported")
    if wire_dtype == "float16":
        if not distributed:
            raise ValueError("wire_dtype='float16' needs a dist kvstore (it halves the bytes "
                             "between workers and servers; one process has no wire)")
        if compression:
            raise ValueError("wire_dtype='float16' with 2-bit compression: the compressed "
                             "pushes already carry 2 bits per element and MXNet's 2-bit "
                             "compression quantises float32 only; choose one")
        return Float16Wire()
    if compression:
        return TwoBitWire(compression.get("threshold", 0.5))
    return Float32Wire()
