"""One attempt on the chosen backend, shared by both front ends: which ``--launcher`` names are
accepted, when ``--firewall on`` is refused, the job spec (no processes but one trivial local
job; real jobs are tests/e2e)."""
import argparse
import dataclasses

import pytest

from mxlarge.cli import main as mxlarge_main
from mxlarge.launcher.__main__ import main as launcher_main
from mxlarge.launcher.job import BACKENDS, JobSpec, firewall_refusal, launcher_choice, run_job
from mxlarge.launcher.registry import SUPPORTED, UNSUPPORTED, backend_for
from mxlarge.plan import World
from tests.helpers import EQ_CONFIG


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
    assert firewall_refusal("local", "on") == backend_for("local").firewall_refusal()
    assert firewall_refusal("local", "on") is not None  # loopback jobs need no filter
    monkeypatch.setattr("mxlarge.launcher.job.local_refusal", lambda: "no nft here")
    assert firewall_refusal("ssh", "on") == (backend_for("ssh").firewall_refusal() or "no nft here")


def test_a_job_spec_is_frozen_data_and_refuses_what_its_backend_cannot_apply():
    """Built once by a front end; an attempt is a replace() of it; options the backend would
    ignore are refused with the reason, before anything starts."""
    spec = JobSpec("local", ["python", "-c", "pass"], World(2), 1, env={"A": "1"})
    assert spec.command == ("python", "-c", "pass")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.world = World(3)  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.env["A"] = "2"  # type: ignore[index]
    assert dataclasses.replace(spec, world=World(1)).env == {"A": "1"}
    with pytest.raises(ValueError, match="--port is for the local launcher"):
        JobSpec("ssh", ["true"], World(1), 1, port=9000)
    with pytest.raises(ValueError, match="--hostfile/--host-ip are for cluster launchers"):
        JobSpec("local", ["true"], World(1), 1, hostfile="hosts")
    with pytest.raises(ValueError, match="'sge' is not supported: "):
        JobSpec("sge", ["true"], World(1), 1)


def test_the_world_reaches_the_command_only_as_the_specs_world():
    """An `mxlarge train` job's argv ends with `--world` of its spec's world, and an attempt in
    another world is a replace() of the world alone; a user's own command is run as given."""
    train = ("python", "-m", "mxlarge.cli", "train", "/c.yaml", "train.epochs=2")
    spec = JobSpec("local", train, World(2, 1, 1, 16), 1, pass_world=True)
    assert spec.argv == (*train, "--world", "2x1x1x16")
    attempt = dataclasses.replace(spec, world=World(1, 1, 2, 16))
    assert attempt.argv == (*train, "--world", "1x1x2x16")
    assert not any(a.startswith(("dist.workers=", "dist.simulate_workers="))
                   for a in attempt.argv)
    assert JobSpec("local", ["my.py", "-x"], World(2), 1).argv == ("my.py", "-x")


def test_launch_builds_a_spec_whose_workers_get_the_world_and_no_workers_text(tmp_path):
    """`mxlarge launch -n 3` of a file declaring 2 workers: the spec's world has 3 processes,
    its workers' argv carries `--world 3x1x1x8` and no `dist.workers=` text."""
    from mxlarge.cli import _parser
    from mxlarge.launch_cli import job_spec

    cfg = tmp_path / "eq.yaml"
    cfg.write_text(EQ_CONFIG)
    args = _parser().parse_args(["launch", str(cfg), "train.epochs=2", "-n", "3", "-s", "2"])
    spec, launched = job_spec(args)
    assert spec.world == World(3, 1, 1, 8) and spec.servers == 2
    assert launched.dist.workers == 3 and launched.train.epochs == 2
    assert spec.argv[-2:] == ("--world", "3x1x1x8")
    assert spec.argv[3:] == ("train", str(cfg.resolve()), "train.epochs=2", "dist.servers=2",
                             "--world", "3x1x1x8")


def test_both_front_ends_refuse_a_cluster_port(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        launcher_main(["-n", "1", "--launcher", "ssh", "--port", "9000", "--", "true"])
    assert e.value.code == 2 and "--port is for the local launcher" in capsys.readouterr().err
    cfg = tmp_path / "eq.yaml"
    cfg.write_text(EQ_CONFIG)
    assert mxlarge_main(["launch", str(cfg), "--launcher", "slurm", "--port", "9000"]) == 2
    assert "--port is for the local launcher" in capsys.readouterr().err


def test_run_job_runs_the_spec_on_its_backend():
    """The local backend, with real (trivial) processes: every role exits 0 at once."""
    out = run_job(JobSpec("local", ["sh", "-c", "exit 0"], World(2), 1, stall_timeout=0))
    assert (out.exit_code, out.message, out.hosts) == \
        (0, "job finished: 2 worker(s), 1 server(s) and the scheduler exited 0", ())
