"""``python -m mxlarge.launcher -n 2 -s 1 [--launcher ssh -H hosts] [--stall-timeout S]
[--max-restarts N] [--firewall auto|on|off] -- CMD ...`` (manual use, e.g. your own
training script)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from mxlarge.launcher.backends.local import PortInUseError
from mxlarge.launcher.firewall import FirewallError
from mxlarge.launcher.flags import add_job_flags
from mxlarge.launcher.job import JobSpec, firewall_refusal, run_job
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.registry import backend_for
from mxlarge.launcher.restart import RestartPolicy, run_with_restarts
from mxlarge.plan import World
from mxlarge.timeline import ENV as TIMELINE_ENV
from mxlarge.timeline import TimelineWindow

#: Where a job's merged timeline goes (:mod:`mxlarge.timeline`): this launcher has no
#: run.
TIMELINE_FILE = "mxlarge-timeline.json"


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the job, return its exit code."""
    p = argparse.ArgumentParser(prog="python -m mxlarge.launcher",
                                description="Run a command as an MXNet dist_sync job.")
    p.add_argument("-n", "--workers", type=int, required=True)
    add_job_flags(p, servers="number of servers (default: as many as workers)",
                  restarts="after a failure (crash, kill, stall) run the whole job again, up to "
                           "N times; the command resumes from its own checkpoints "
                           "(mxlarge.resume)")
    p.add_argument("--host-ip", default=None,
                   help="address of the scheduler for cluster launchers (dmlc --host-ip)")
    p.add_argument("--env", type=_env_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every process (repeatable)")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds between SIGTERM and SIGKILL on teardown")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("no command given (put it after --)")
    if a.max_restarts < 0:
        p.error(f"--max-restarts {a.max_restarts}: expected an integer >= 0")
    try:  # the world of a command of the user's own is its processes only (no --world added)
        spec = JobSpec(a.launcher, command, World(processes=a.workers),
                       a.workers if a.servers is None else a.servers, env=dict(a.env),
                       stall_timeout=a.stall_timeout, tuning=not a.no_tuning,
                       firewall=a.firewall, port=a.port, hostfile=a.hostfile,
                       host_ip=a.host_ip, grace=a.grace)
    except ValueError as e:
        p.error(str(e))
    why = firewall_refusal(a.launcher, a.firewall)
    if why:
        p.error(f"--firewall on: {why}")
    window = dict(a.env).get(TIMELINE_ENV, os.environ.get(TIMELINE_ENV))
    if window:  # a window the workers would refuse is refused before anything starts
        try:
            TimelineWindow.parse(window)
        except ValueError as e:
            p.error(str(e))

    def attempt(number: int) -> Outcome:
        outcome = run_job(spec)
        if outcome.timeline is not None:  # no run to log it in: a file here
            path = os.path.abspath(TIMELINE_FILE)
            with open(path, "w") as f:
                json.dump(outcome.timeline, f)
            print(f"[launcher] timeline: {path} (open it in https://ui.perfetto.dev)",
                  flush=True)
        return outcome

    try:
        backend_for(a.launcher).preflight(spec)  # every host answers, before anything starts
        return run_with_restarts(attempt, RestartPolicy(a.max_restarts),
                                 lambda line: print(f"[launcher] {line}", flush=True)).exit_code
    except (ValueError, PortInUseError, NotImplementedError, FileNotFoundError,
            FirewallError) as e:
        print(f"mxlarge.launcher: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
