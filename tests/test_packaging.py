"""The install path: the MXNet flavour is the user's choice, and `make` installs the CPU one.

`mxnet` (CPU) and `mxnet-cu112` both install the package `mxnet/`; a hard `mxnet==1.9.1` in the
requirements made `pip install mxlarge` replace a GPU build with the CPU wheel.
"""
from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _requirements() -> list[Requirement]:
    return [Requirement(r) for r in metadata.requires("mxlarge") or []]


def _extra_of(req: Requirement) -> str | None:
    m = re.search(r'extra == "([^"]+)"', str(req.marker)) if req.marker else None
    return m.group(1) if m else None


def test_installed_metadata_does_not_force_an_mxnet_flavour():
    reqs = _requirements()
    unconditional = [r.name for r in reqs if _extra_of(r) is None]
    assert "numpy" in unconditional  # the metadata was read at all
    assert not [n for n in unconditional if n.startswith("mxnet")], unconditional
    flavours = {_extra_of(r): (r.name, str(r.specifier)) for r in reqs
                if r.name.startswith("mxnet")}
    assert flavours == {"cpu": ("mxnet", "==1.9.1"), "cu112": ("mxnet-cu112", "==1.9.1")}


def test_make_and_ci_install_the_cpu_wheel():
    """`make demo`, `make test` and .ci/run (which runs `make test`) share the one install rule."""
    makefile = (ROOT / "Makefile").read_text()
    installs = re.findall(r"pip install .*-e \"\.\[([^\]]*)\]\"", makefile)
    assert installs and all("cpu" in extras.split(",") for extras in installs), installs
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_one_version_shown_by_both_front_ends_and_described_in_the_changelog():
    """``mxlarge.__version__`` is the one place: setup.cfg reads it, ``mxlarge --version`` and
    ``python -m mxlarge.launcher --version`` print it, and CHANGELOG.md's newest release is it.
    The LICENSE is the Apache-2.0 text setup.cfg names."""
    import subprocess
    import sys

    import mxlarge

    cfg = (ROOT / "setup.cfg").read_text()
    assert "version = attr: mxlarge.__version__" in cfg and "license = Apache-2.0" in cfg
    for module in ("mxlarge.cli", "mxlarge.launcher"):
        out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                             text=True, check=True).stdout
        assert out == f"mxlarge {mxlarge.__version__}\n", (module, out)
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$",
                          (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases and releases[0] == mxlarge.__version__, releases
    licence = (ROOT / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert "END OF TERMS AND CONDITIONS" in licence
