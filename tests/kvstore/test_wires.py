"""What travels (mxlarge.kvstore.wires): each wire's round trip against closed forms, and the
choice made once, with the reasons for what cannot be chosen."""
from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest

from mxlarge.kvstore.fusion import FUSE_KEY, Bucket
from mxlarge.kvstore.wires import (
    WIRE_KEY,
    Float16Wire,
    Float32Wire,
    TwoBitWire,
    wire_for,
)

ALONE = Bucket(3, (3,), (0,), 6)
FUSED = Bucket(FUSE_KEY + 1, (4, 5), (0, 2), 6)


def test_the_wire_is_chosen_once_and_what_cannot_be_is_refused_with_the_reason():
    assert type(wire_for(True, "float32", None)) is Float32Wire
    assert type(wire_for(True, "float16", None)) is Float16Wire
    two = wire_for(True, "float32", {"type": "2bit", "threshold": 0.5})
    assert type(two) is TwoBitWire and two.split and two.compressed
    for args, message in (
            ((False, "float16", None), "wire_dtype='float16' needs a dist kvstore"),
            ((False, "float32", {"type": "2bit"}), "gradient compression needs a dist kvstore"),
            ((True, "float32", {"type": "1bit"}), "only '2bit' is supported"),
            ((True, "float16", {"type": "2bit"}), "with 2-bit compression"),
            ((True, "bfloat16", None), "expected one of float32, float16")):
        with pytest.raises(ValueError, match=message):
            wire_for(*args)


def test_float32_sends_the_gradients_themselves():
    wire = Float32Wire()
    grads = [mx.nd.array([1.0, 2.0])]
    assert wire.outbound(ALONE, grads, 8.0) is grads and wire.key(ALONE) == 3
    assert wire.prescale(8.0) == 1.0 and wire.itemsize(ALONE, "float32") == 4


def test_float16_sends_s_g_in_its_own_buffers_under_its_own_key_and_scales_back():
    """s·g rounded once to float16 and divided by s: within float16's half ulp of s·g."""
    wire = Float16Wire()
    wire.prepare(ALONE, (6,), "float32", [mx.cpu()])
    wire.prepare(FUSED, (6,), "float32", [mx.cpu()])
    assert wire.key(ALONE) == WIRE_KEY + 3 and wire.key(FUSED) == FUSE_KEY + 1
    assert wire.itemsize(ALONE, "float32") == 2 and wire.itemsize(ALONE, "float16") == 2
    g = np.array([1e-3, -2.5, 3.0e-5, 7.0, -0.125, 30000.0 / 256], np.float32)
    grads = [mx.nd.array(g)]
    s = wire.prescale(256.0)
    sent = wire.outbound(ALONE, grads, s)
    assert sent is not grads and sent[0].dtype == np.float16
    np.testing.assert_array_equal(sent[0].asnumpy(), (g * s).astype(np.float16))
    sent[0][:] = sent[0] * 2  # the servers' sum of 2 equal workers
    wire.inbound(ALONE, grads, sent, s)
    expected = 2 * (g * s).astype(np.float16).astype(np.float32) / s
    np.testing.assert_allclose(grads[0].asnumpy(), expected, rtol=1e-6)
    assert wire.prescale(float("inf")) == 1.0 and wire.prescale(0.0) == 1.0


def test_float16_gradients_travel_as_they_are():
    wire = Float16Wire()
    wire.prepare(ALONE, (6,), "float16", [mx.cpu()])
    grads = [mx.nd.ones(6, dtype="float16")]
    assert wire.outbound(ALONE, grads, 4.0) is grads and wire.key(ALONE) == 3


def test_two_bit_gathers_every_float_as_its_32_bits_exactly():
    wire = TwoBitWire(0.5)
    rng = np.random.RandomState(0)
    rows = rng.randn(3, 5).astype(np.float32)
    slots = np.stack([wire.gather_slot(r) for r in rows])
    assert slots.shape == (3, 5 * 32) and set(np.unique(slots)) <= {0.0, 0.5}
    np.testing.assert_array_equal(wire.gather_rows(slots, 5).view(np.uint32),
                                  rows.view(np.uint32))
