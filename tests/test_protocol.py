"""The worker side of the job protocol: a Beat's records as the launcher reads them, and the
one reader of the launcher's heartbeat directory."""
import os
import time

from mxlarge.protocol import heartbeat


def test_beat_writes_records_the_watchdog_reads(tmp_path):
    beat = heartbeat.Beat(tmp_path, rank=3, interval=0.05)
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


def test_finish_marks_every_issued_update_done_and_the_phase_finished(tmp_path):
    """At exit (after waitall and the last barrier) every Beat of the process says finished,
    with the updates it issued counted as done; the writer thread keeps saying it."""
    beat = heartbeat.Beat(tmp_path, rank=1, interval=0.05)
    beat.step(0, 0)
    for t in range(1, 5):
        beat.step(t - 1, t)
        beat.step(t, t)  # update t issued: 0..t-1 done
    assert beat.done == 4
    heartbeat.finish_all()
    rec = heartbeat.read_all(tmp_path)[1]
    assert (rec.phase, rec.done, rec.issued, rec.here) == (heartbeat.FINISHED, 5, 4, 5)
    time.sleep(0.2)
    assert heartbeat.read_all(tmp_path)[1].phase == heartbeat.FINISHED
