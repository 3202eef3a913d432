"""The Trainer's states files: mxlarge's own (an MXNet NDArray file, no pickle) and
``gluon.Trainer.save_states``'s (a pickle), read without running code.

mxlarge's file holds, by parameter *position* (Gluon 1.x names parameters with
process-global counters, so the same net built twice in one process gets other names):
``momentum:<i>`` (the velocity, MXNet's eq. (10) quantity), ``master:<i>`` (the float32
master copy of a float16 weight under ``multi_precision``), ``num_update`` (an int64
array) and, under AMP, ``amp_loss_scaler`` (its dynamic loss scale, so a resume
continues it). Any other MXNet optimizer's state (Adam's mean and variance, ...) is kept
as its arrays in order, ``state0:<i>``, ``state1:<i>``, ...
(:meth:`~mxlarge.kvstore.any_optimizer.MXNetUpdate.parts`).
"""
from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any

import mxnet as mx
import numpy as np

from mxlarge.kvstore.updater import LargeBatchSGD

#: The update count's key in mxlarge's states files.
NUM_UPDATE_KEY = "num_update"
#: AMP's dynamic loss scaler (loss scale, next loss scale, steps since the last
#: overflow).
AMP_KEY = "amp_loss_scaler"


class _GluonStates(pickle.Unpickler):
    """Reads ``gluon.Trainer.save_states`` files: a pickle of (states, optimizer) or
    states.

    Only MXNet (and GluonCV scheduler) classes and plain containers may be constructed:
    a states file is data, never code to run.
    """

    _ALLOWED_MODULES = ("mxnet.", "gluoncv.")
    _ALLOWED = {("builtins", "bytearray"), ("copyreg", "_reconstructor"),
                ("builtins", "object")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED or module.startswith(self._ALLOWED_MODULES):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a states file")


#: ``parts(i, state)``: the named arrays of parameter i's optimizer state (the updater's
#: ``parts``), e.g. ``{"momentum": v, "master": w32}``.
Parts = Callable[[int, Any], dict[str, mx.nd.NDArray]]


def sgd_parts(i: int, state: Any) -> dict[str, mx.nd.NDArray]:
    """The momentum-SGD family's state (a momentum array, None, or ``(momentum or None,
    master)``) by part."""
    return LargeBatchSGD.parts(tuple(state) if isinstance(state, list) else state, None)


def state_arrays(states: list[list[Any]], pushed: list[int], parts: Parts = sgd_parts,
                 device: int = 0) -> dict[str, mx.nd.NDArray]:
    """Device ``device``'s states of the ``pushed`` parameters, keyed ``<part>:<i>``
    (module docstring)."""
    return {f"{kind}:{i}": array for i in pushed
            for kind, array in parts(i, states[i][device]).items()}


def read(fname: str, names: list[str], parts: Parts = sgd_parts
         ) -> tuple[dict[str, mx.nd.NDArray], int | None]:
    """The arrays and update count of mxlarge's file or of Gluon's (told apart by the
    pickle's first byte); ``names`` are the Trainer's parameter names in its order."""
    with open(fname, "rb") as fh:
        head = fh.read(1)
    if head == b"\x80":
        return _gluon_states(fname, names, parts)
    loaded = mx.nd.load(fname)
    count = loaded.pop(NUM_UPDATE_KEY, None)
    return loaded, None if count is None else int(count.asnumpy()[0])


def _gluon_states(fname: str, names: list[str], parts: Parts
                  ) -> tuple[dict[str, mx.nd.NDArray], int | None]:
    """Gluon's states by parameter index, re-keyed to this Trainer's positions
    (gluon.Trainer numbers a ParameterDict's parameters in *sorted name* order), and the
    pickled optimizer's ``num_update`` (None when the file has no optimizer), each state
    split by ``parts`` (the same optimizer makes the same layout)."""
    with open(fname, "rb") as fh:
        try:
            obj = _GluonStates(io.BytesIO(fh.read())).load()
        except (pickle.UnpicklingError, AttributeError, ImportError, EOFError) as e:
            raise ValueError(f"{fname}: not a gluon.Trainer states file ({e})") from None
    states, optimizer = obj if isinstance(obj, tuple) and len(obj) == 2 else (obj, None)
    if not isinstance(states, dict):
        raise ValueError(f"{fname}: not a gluon.Trainer states file")
    by_gluon_index = {j: names.index(name) for j, name in enumerate(sorted(names))}
    out = {}
    for index, state in states.items():
        i = by_gluon_index.get(int(index), -1)
        out.update({f"{kind}:{i}": array for kind, array in parts(i, state).items()})
    count = getattr(optimizer, "num_update", None)
    return out, None if count is None else int(count)


def check(loaded: dict[str, mx.nd.NDArray], expected: dict[str, mx.nd.NDArray],
          names: list[str], fname: str) -> None:
    """Refuses a file whose keys or shapes are not this net's (naming the first difference)."""
    missing = sorted(set(expected) - set(loaded))
    extra = sorted(set(loaded) - set(expected))
    if missing or extra:
        raise ValueError(f"{fname}: optimizer states do not match this net "
                         f"(missing {missing[:3]}, unexpected {extra[:3]})")
    for key, value in expected.items():
        if loaded[key].shape != value.shape:
            name = names[int(key.split(":")[1])]
            raise ValueError(f"{fname}: '{key}' ({name}) has shape {loaded[key].shape}, "
                             f"expected {value.shape}")


def amp_scale(scaler: Any) -> list[float]:
    """AMP's dynamic loss scaler as (loss scale, next loss scale, steps since the last
    overflow). The one reader of its private fields: MXNet 1.9.1's ``LossScaler`` has no
    public way to save and restore it."""
    return [scaler._loss_scale, scaler._next_loss_scale, scaler._unskipped]


def set_amp_scale(scaler: Any, values: list[float]) -> None:
    """The inverse of :func:`amp_scale`."""
    scaler._loss_scale = values[0]
    scaler._next_loss_scale = values[1]
    scaler._unskipped = int(values[2])


class OptimizerStates:
    """The optimizer's state per (parameter, device): made once every shape is known
    (:meth:`create`), float32 masters taken from the weights at the first update,
    written and read as states files (module docstring).

    Args:
        updater: the optimizer that makes and reads the states (its ``parts``).
        params: every parameter, in the Trainer's order; ``names`` their names.
    """

    def __init__(self, updater: Any, params: list[mx.gluon.Parameter], names: list[str]):
        self.updater = updater
        self.params = params
        self.names = names
        self.states: list[list[Any]] = []
        self.pushed: tuple[int, ...] = ()
        self.created = False
        self._masters_current = False  # master copies taken from the weights (or a file)
        self._loaded: dict[str, mx.nd.NDArray] | None = None  # a file read before shapes

    def create(self, pushed: tuple[int, ...]) -> None:
        """One state per (parameter, device), devices applying identical updates; a file
        loaded before the shapes were known is set now."""
        self.pushed = pushed
        self.created = True
        self.states = [[self.updater.create_state_multi_precision(i, w) for w in p.list_data()]
                       for i, p in enumerate(self.params)]
        if self._loaded is not None:
            loaded = self._loaded
            self._loaded = None
            self._set(loaded, "load_states")

    def on_device(self, d: int) -> list[Any]:
        """The pushed parameters' states on device ``d``, in order."""
        return [self.states[i][d] for i in self.pushed]

    def refresh_masters(self) -> None:
        """Float32 master copies from the current float16 weights, once, at the first
        update (weights loaded after construction count; a states file's masters are
        kept)."""
        if self._masters_current:
            return
        self._masters_current = True
        for i in self.pushed:
            for w, state in zip(self.params[i].list_data(), self.states[i]):
                master = self.updater.parts(state, w.dtype).get("master")
                if master is not None:
                    w.astype(np.float32).copyto(master)

    def parts(self, i: int, state: Any) -> dict[str, mx.nd.NDArray]:
        """Parameter i's optimizer state by part (a :data:`Parts`)."""
        dtype = self.params[i].dtype if 0 <= i < len(self.params) else None
        return self.updater.parts(state, dtype)

    def arrays(self, scaler: Any = None) -> dict[str, mx.nd.NDArray]:
        """Device 0's states keyed ``<part>:<i>``, and AMP's loss scale under ``scaler``."""
        self.refresh_masters()
        out = state_arrays(self.states, list(self.pushed), self.parts)
        if scaler is not None:  # so a resume continues the dynamic loss scale exactly
            out[AMP_KEY] = mx.nd.array(amp_scale(scaler), dtype="float64")
        return out

    def save(self, fname: str, num_update: int, scaler: Any = None) -> None:
        """:meth:`arrays` and the update count as an MXNet NDArray file (no pickle)."""
        mx.nd.save(fname, {**self.arrays(scaler),
                           NUM_UPDATE_KEY: mx.nd.array([num_update], dtype="int64")})

    def load(self, fname: str, scaler: Any = None) -> int | None:
        """Reads mxlarge's file or Gluon's (:func:`read`), sets the states (or keeps
        them until :meth:`create`) and AMP's scale; returns the file's update count, if
        any."""
        loaded, count = read(fname, self.names, self.parts)
        amp_state = loaded.pop(AMP_KEY, None)
        if amp_state is not None and scaler is not None:
            set_amp_scale(scaler, amp_state.asnumpy().tolist())
        if self.created:
            self._set(loaded, fname)
        else:
            self._loaded = loaded
        return count

    def _set(self, loaded: dict[str, mx.nd.NDArray], fname: str) -> None:
        expected = state_arrays(self.states, list(self.pushed), self.parts)
        check(loaded, expected, self.names, fname)
        for d in range(len(self.params[0].list_ctx()) if self.params else 0):
            for key, target in state_arrays(self.states, list(self.pushed), self.parts,
                                            device=d).items():
                loaded[key].astype(target.dtype).copyto(target)
        self._masters_current = True
