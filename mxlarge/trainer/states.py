"""The Trainer's states files: mxlarge's own (an MXNet NDArray file, no pickle) and
``gluon.Trainer.save_states``'s (a pickle), read without running code.

mxlarge's file holds, by parameter *position* (Gluon 1.x names parameters with process-global
counters, so the same net built twice in one process gets other names): ``momentum:<i>`` (the
velocity, MXNet's eq. (10) quantity), ``master:<i>`` (the float32 master copy of a float16
weight under ``multi_precision``), ``num_update`` (an int64 array) and, under AMP,
``amp_loss_scaler`` (its dynamic loss scale, so a resume continues it). Any other MXNet
optimizer's state (Adam's mean and variance, ...) is kept as its arrays in order, ``state0:<i>``,
``state1:<i>``, ... (:meth:`~mxlarge.kvstore.any_optimizer.MXNetUpdate.parts`).
"""
from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any

import mxnet as mx

from mxlarge.kvstore.updater import LargeBatchSGD

#: The update count's key in mxlarge's states files.
NUM_UPDATE_KEY = "num_update"
#: AMP's dynamic loss scaler (loss scale, next loss scale, steps since the last overflow).
AMP_KEY = "amp_loss_scaler"


class _GluonStates(pickle.Unpickler):
    """Reads ``gluon.Trainer.save_states`` files: a pickle of (states, optimizer) or states.

    Only MXNet (and GluonCV scheduler) classes and plain containers may be constructed: a
    states file is data, never code to run.
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
    """Device ``device``'s states of the ``pushed`` parameters, keyed ``<part>:<i>`` (module
    docstring)."""
    return {f"{kind}:{i}": array for i in pushed
            for kind, array in parts(i, states[i][device]).items()}


def read(fname: str, names: list[str], parts: Parts = sgd_parts
         ) -> tuple[dict[str, mx.nd.NDArray], int | None]:
    """The arrays and update count of mxlarge's file or of Gluon's (told apart by the pickle's
    first byte); ``names`` are the Trainer's parameter names in its order."""
    with open(fname, "rb") as fh:
        head = fh.read(1)
    if head == b"\x80":
        return _gluon_states(fname, names, parts)
    loaded = mx.nd.load(fname)
    count = loaded.pop(NUM_UPDATE_KEY, None)
    return loaded, None if count is None else int(count.asnumpy()[0])


def _gluon_states(fname: str, names: list[str], parts: Parts
                  ) -> tuple[dict[str, mx.nd.NDArray], int | None]:
    """Gluon's states by parameter index, re-keyed to this Trainer's positions (gluon.Trainer
    numbers a ParameterDict's parameters in *sorted name* order), and the pickled optimizer's
    ``num_update`` (None when the file has no optimizer), each state split by ``parts`` (the
    same optimizer makes the same layout)."""
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
