"""One attempt on the chosen backend, shared by both front ends: which ``--launcher`` names are
accepted, and when ``--firewall on`` is refused (no processes; real jobs are tests/e2e)."""
import argparse

import pytest

from mxlarge.cli import main as mxlarge_main
from mxlarge.launcher import firewall
from mxlarge.launcher.__main__ import main as launcher_main
from mxlarge.launcher.cluster import SUPPORTED, UNSUPPORTED
from mxlarge.launcher.job import BACKENDS, firewall_refusal, launcher_choice


def test_the_backends_are_local_and_the_supported_cluster_ones():
    assert BACKENDS == ("local", *SUPPORTED)
    for name in BACKENDS:
        assert launcher_choice(name) == name


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_broken_backends_are_refused_with_the_reason(name):
    with pytest.raises(argparse.ArgumentTypeError, match=f"'{name}' is not supported: "):
        launcher_choice(name)


def test_an_unknown_backend_lists_the_choices():
    with pytest.raises(argparse.ArgumentTypeError,
                       match=f"'pbs': expected one of {', '.join(BACKENDS)}"):
        launcher_choice("pbs")


@pytest.mark.parametrize("main,argv", [
    (mxlarge_main, ["launch", "cfg.yaml", "--launcher"]),
    (launcher_main, ["-n", "1", "--launcher"]),
])
def test_both_front_ends_refuse_the_same_names_the_same_way(main, argv, capsys):
    for name in (*UNSUPPORTED, "pbs"):
        with pytest.raises(SystemExit) as e:
            main([*argv, name, "--", "true"] if main is launcher_main else [*argv, name])
        assert e.value.code == 2
        err = capsys.readouterr().err
        with pytest.raises(argparse.ArgumentTypeError) as why:
            launcher_choice(name)
        assert str(why.value) in err


def test_firewall_on_is_refused_only_where_it_cannot_apply(monkeypatch):
    for mode in ("auto", "off"):
        for name in BACKENDS:
            assert firewall_refusal(name, mode) is None
    assert firewall_refusal("local", "on") == firewall.refusal("local")
    assert firewall_refusal("local", "on") is not None  # loopback jobs need no filter
    monkeypatch.setattr("mxlarge.launcher.job.local_refusal", lambda: "no nft here")
    assert firewall_refusal("ssh", "on") == (firewall.refusal("ssh") or "no nft here")
