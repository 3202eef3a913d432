"""The worker side of the job protocol: a HeartbeatWriter's records as the launcher reads
them, the one reader of the launcher's heartbeat directory, and the worker session that settles
and finishes them."""
import os
import subprocess
import sys
import textwrap
import threading
import time

from mxlarge.protocol import heartbeat
from mxlarge.protocol.session import WorkerSession


def test_beat_writes_records_the_watchdog_reads(tmp_path):
    beat = heartbeat.HeartbeatWriter(tmp_path, rank=3, interval=0.05)
    beat.step(0, 7)      # first update issued at step 7 (a resumed worker)
    beat.step(7, 7)
    beat.step(7, 8)
    beat.step(8, 8)      # update 7 complete
    with beat.busy("evaluating"):
        time.sleep(0.3)  # the writer thread reports the phase
        rec = heartbeat.read_all(tmp_path)[3]
        assert (rec.phase, rec.done, rec.issued, rec.here) == ("evaluating", 8, 8, 1)
    time.sleep(0.3)
    rec = heartbeat.read_all(tmp_path)[3]
    assert rec.phase == "train" and rec.pid == os.getpid() and rec.tick > 3
    assert len(heartbeat.path_for(tmp_path, 3).read_bytes()) == heartbeat.SIZE


def test_launched_dir_is_the_launchers_directory_or_none(monkeypatch, tmp_path):
    monkeypatch.delenv(heartbeat.ENV, raising=False)
    assert heartbeat.launched_dir() is None
    monkeypatch.setenv(heartbeat.ENV, "")
    assert heartbeat.launched_dir() is None
    monkeypatch.setenv(heartbeat.ENV, str(tmp_path))
    assert heartbeat.launched_dir() == tmp_path


def test_a_record_reads_back_and_a_torn_one_is_none():
    rec = heartbeat.Record(2, "h", 7, 5, 6, 1, "train", 3)
    data = rec.encode()
    assert len(data) == heartbeat.SIZE and heartbeat.Record.decode(data) == rec
    assert heartbeat.Record.decode(data[:40]) is None
    assert heartbeat.Record.decode(b"") is None


def test_a_beat_carries_the_step_breakdown_and_old_records_still_read(tmp_path):
    """Record.parts: None until the worker sets it, then at the next write; a record written
    before the field existed decodes with None; the widest breakdown fits in SIZE bytes."""
    beat = heartbeat.HeartbeatWriter(tmp_path, rank=1, interval=0.05)
    assert heartbeat.read_all(tmp_path)[1].parts is None
    parts = {"data": 0.8, "compute": 17.6, "exchange": 4.8, "update": 0.8, "step": 27.7,
             "n": 20.0, "at": 190.0, "end": 1764900000.1234}
    beat.set_parts(parts)
    time.sleep(0.3)
    assert heartbeat.read_all(tmp_path)[1].parts == parts
    old = b'{"rank":2,"host":"h","pid":7,"done":5,"issued":6,"here":1,"phase":"train","tick":3}'
    assert heartbeat.Record.decode(old.ljust(heartbeat.SIZE - 1) + b"\n") == \
        heartbeat.Record(2, "h", 7, 5, 6, 1, "train", 3, None)
    widest = heartbeat.Record(2 ** 31, "h" * 64, 2 ** 22, 10 ** 12, 10 ** 12, 10 ** 12,
                              "evaluating/checkpointing", 10 ** 12,
                              {**{k: 99999.9 for k in parts}, "at": 1e12, "end": 9.9e9 + 0.1234})
    assert heartbeat.Record.decode(widest.encode()) == widest


def test_finish_marks_every_issued_update_done_and_the_phase_finished(tmp_path):
    """At exit (after waitall and the last barrier) every HeartbeatWriter of the process says
    finished, with the updates it issued counted as done; the writer thread keeps saying it."""
    session = WorkerSession()
    beat = session.beat(tmp_path, rank=1, interval=0.05)
    beat.step(0, 0)
    for t in range(1, 5):
        beat.step(t - 1, t)
        beat.step(t, t)  # update t issued: 0..t-1 done
    assert beat.done == 4
    session.finish()
    rec = heartbeat.read_all(tmp_path)[1]
    assert (rec.phase, rec.done, rec.issued, rec.here) == (heartbeat.FINISHED, 5, 4, 5)
    time.sleep(0.2)
    assert heartbeat.read_all(tmp_path)[1].phase == heartbeat.FINISHED


class _Pending:
    """An update's result that exists once ``ready`` is set (as an NDArray's pending write)."""

    def __init__(self, error: BaseException | None = None):
        self.ready = threading.Event()
        self.error = error

    def wait_to_read(self) -> None:
        self.ready.wait()
        if self.error is not None:
            raise self.error


def _until(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


def test_an_update_counts_as_done_once_its_result_exists_and_the_record_says_so(tmp_path):
    beat = heartbeat.HeartbeatWriter(tmp_path, rank=0, interval=60)
    beat.issue(0)
    r0 = _Pending()
    beat.completes(0, r0)  # returns at once: one update unconfirmed
    time.sleep(0.1)
    assert beat.done == 0 and heartbeat.read_all(tmp_path)[0].done == 0
    r0.ready.set()
    assert _until(lambda: beat.done == 1)
    assert heartbeat.read_all(tmp_path)[0].done == 1  # written by the watcher, not the timer
    beat.finish()


def test_the_training_thread_waits_only_when_ahead_updates_are_unconfirmed(tmp_path):
    """A stuck job: Python issues AHEAD updates and then waits, until half of them are done."""
    beat = heartbeat.HeartbeatWriter(tmp_path, rank=0, interval=60)
    results = [_Pending() for _ in range(heartbeat.AHEAD + 1)]
    returned: list[int] = []

    def train():
        for t, r in enumerate(results):
            beat.issue(t)
            beat.completes(t, r)
            returned.append(t)

    th = threading.Thread(target=train, daemon=True)
    th.start()
    assert _until(lambda: len(returned) == heartbeat.AHEAD)
    time.sleep(0.2)
    assert len(returned) == heartbeat.AHEAD and th.is_alive()  # update AHEAD waits
    for r in results:
        r.ready.set()  # the watcher waits for the newest result handed to it
    th.join(5)
    assert not th.is_alive() and returned[-1] == heartbeat.AHEAD
    assert _until(lambda: beat.done == heartbeat.AHEAD + 1)
    beat.finish()


def test_a_failed_update_is_raised_on_the_training_thread(tmp_path):
    beat = heartbeat.HeartbeatWriter(tmp_path, rank=0, interval=60)
    failed = _Pending(RuntimeError("MXNetError: the update's operator failed"))
    failed.ready.set()
    beat.issue(0)
    beat.completes(0, failed)
    assert _until(lambda: beat._error is not None)
    beat.issue(1)
    try:
        beat.completes(1, _Pending())
    except RuntimeError as e:
        assert "operator failed" in str(e)
    else:
        raise AssertionError("the watcher's error was not raised")


def test_finish_stops_the_watcher_thread(tmp_path):
    beat = heartbeat.HeartbeatWriter(tmp_path, rank=0, interval=60)
    beat.issue(0)
    done = _Pending()
    done.ready.set()
    beat.completes(0, done)
    watcher = beat._watcher
    assert watcher is not None and watcher.is_alive()
    beat.finish()
    assert not watcher.is_alive() and beat.done == 1


def test_settle_waits_for_the_updates_handed_over_within_its_timeout(tmp_path):
    """A failing worker's last record names the step it failed at (the restart policy compares
    them), unless its job is stuck: then settle gives up after its timeout."""
    session = WorkerSession()
    beat = session.beat(tmp_path, rank=0, interval=60)
    late = _Pending()
    beat.issue(0)
    beat.completes(0, late)
    threading.Timer(0.2, late.ready.set).start()
    session.settle(5.0)
    assert beat.done == 1 and heartbeat.read_all(tmp_path)[0].done == 1
    beat.issue(1)
    beat.completes(1, _Pending())  # stuck
    t0 = time.monotonic()
    session.settle(0.3)
    assert 0.25 < time.monotonic() - t0 < 2 and beat.done == 1


def test_a_failing_worker_settles_its_heartbeat_before_it_leaves_at_once(tmp_path):
    """The session's fail-fast path: an error inside ``fail_fast()`` exits with status 1 at
    once (no atexit), after the watcher confirmed the update handed to it, so the last record
    names the step the worker failed at."""
    code = textwrap.dedent(f"""
        import atexit, threading
        from mxlarge.protocol.session import SESSION

        class Late:
            ready = threading.Event()
            def wait_to_read(self):
                self.ready.wait()

        atexit.register(lambda: print("atexit ran", flush=True))
        beat = SESSION.beat({str(tmp_path)!r}, rank=2, interval=60)
        late = Late()
        beat.issue(0)
        beat.completes(0, late)
        threading.Timer(0.3, late.ready.set).start()
        with SESSION.fail_fast():
            raise RuntimeError("the step failed")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "RuntimeError: the step failed" in r.stderr, r.stderr
    assert "atexit ran" not in r.stdout
    assert heartbeat.read_all(tmp_path)[2].done == 1


def test_fail_fast_keeps_a_clean_exit_and_exits_with_the_status_given(tmp_path):
    code = ("import sys\nfrom mxlarge.protocol.failfast import fail_fast\n"
            "with fail_fast():\n    sys.exit(int(sys.argv[1]))\n")
    for status in (0, 3):
        r = subprocess.run([sys.executable, "-c", code, str(status)], timeout=60)
        assert r.returncode == status


def test_only_rank_0_hears_the_launchers_stop_once(tmp_path):
    """The launcher's stop file is read by rank 0's writer thread within its interval, which
    calls ``on_stop`` once; rank 1 never (it waits for rank 0 in its next exchange), and
    neither before the file exists."""
    heard: dict[int, int] = {0: 0, 1: 0}
    beats = [heartbeat.HeartbeatWriter(tmp_path, rank=r, interval=0.05) for r in (0, 1)]
    for r, beat in enumerate(beats):
        beat.on_stop = lambda r=r: heard.__setitem__(r, heard[r] + 1)
    time.sleep(0.2)
    assert heard == {0: 0, 1: 0}
    heartbeat.ask_stop(tmp_path)
    deadline = time.monotonic() + 5
    while not heard[0]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.3)
    assert heard == {0: 1, 1: 0}
