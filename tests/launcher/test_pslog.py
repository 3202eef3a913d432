"""mxlarge.launcher.pslog on the lines ps-lite (MXNet 1.9.1) printed in real jobs
(``tests/e2e/test_foreign_packets.py`` runs the real processes)."""
from mxlarge.launcher.pslog import PsLog, verbose_env

BIND_S = ("[10:06:59] ../3rdparty/ps-lite/src/van.cc:310: Bind to role=scheduler, id=1, "
          "ip=127.0.0.1, port=55321, is_recovery=0")
BIND_W = ("[10:07:01] ../3rdparty/ps-lite/src/van.cc:310: Bind to role=worker, ip=198.18.0.12, "
          "port=56831, is_recovery=0")
ABORT = ("  what():  [10:07:01] ../3rdparty/ps-lite/src/van.cc:520: Check failed: "
         "pb.ParseFromArray(meta_buf, buf_size): failed to parse string into protobuf")
VERBOSE = [
    BIND_S,
    "[10:07:29] ../3rdparty/ps-lite/src/van.cc:70: assign rank=9 to node role=worker, "
    "ip=127.0.0.1, port=32835, is_recovery=0",
    "[10:07:29] ../3rdparty/ps-lite/src/van.cc:97: the scheduler is connected to 2 workers and "
    "2 servers",
    "[10:07:29] ../3rdparty/ps-lite/src/van.cc:257: W[9] is connected to others",
    "[10:07:29] ../3rdparty/ps-lite/src/van.cc:199: Barrier count for 7 : 5",
    "[10:07:29] ../3rdparty/ps-lite/src/./zmq_van.h:51: W[9] is stopping",
    "[10:07:29] ../3rdparty/ps-lite/src/van.cc:45: W[9] is stopped",
]


def test_the_launcher_asks_for_verbosity_only_where_the_user_did_not():
    assert verbose_env({}) == {"PS_VERBOSE": "1"}
    assert verbose_env({"PS_VERBOSE": "2"}) == {}


def test_level_1_lines_are_hidden_only_when_the_launcher_asked_for_them():
    assert [PsLog(hide_verbose=True).see(line) for line in VERBOSE] == [False] * len(VERBOSE)
    assert all(PsLog(hide_verbose=False).see(line) for line in VERBOSE)
    shown = PsLog(hide_verbose=True)
    assert shown.see(ABORT) and shown.see("kv_worker ready rank=0")
    assert shown.see("[10:07:29] ../3rdparty/ps-lite/src/van.cc:45: something else")


def test_a_malformed_message_is_named_with_the_port():
    log = PsLog(hide_verbose=True)
    log.see(BIND_W)
    assert log.cause() is None  # bound, nothing wrong yet
    log.see(ABORT)
    cause = log.cause()
    assert cause is not None
    assert cause.startswith("ps-lite aborted on a malformed message that arrived on its port "
                            "198.18.0.12:56831 (van.cc:520")
    assert "something outside the job" in cause
    # ps-lite logs no peer and the connection died with the process: the line says so
    assert "its sender cannot be told here" in cause


def test_an_mpirun_stream_names_every_port_it_carries():
    log = PsLog(hide_verbose=True)
    for line in (BIND_S, BIND_W, ABORT):
        log.see(line)
    assert "on one of its ports (127.0.0.1:55321, 198.18.0.12:56831)" in (log.cause() or "")


def test_without_a_bind_line_the_cause_is_still_named():
    log = PsLog(hide_verbose=False)
    log.see(ABORT)
    assert "malformed message that arrived on its port (van.cc:520" in (log.cause() or "")


def test_bytes_that_parse_as_an_empty_meta_are_named_too():
    # a TLS ClientHello now and then parses as a ps-lite meta without a sender (measured with the
    # real scheduler: 2 of 40 ClientHellos); ps-lite then fails its next check
    log = PsLog(hide_verbose=True)
    log.see(BIND_S)
    log.see("  what():  [20:42:11] ../3rdparty/ps-lite/src/van.cc:225: Check failed: "
            "msg->meta.sender != Meta::kEmpty (2147483647 vs. 2147483647) : ")
    assert (log.cause() or "").startswith(
        "ps-lite aborted on a malformed message that arrived on its port 127.0.0.1:55321 "
        "(van.cc:225: msg->meta.sender != Meta::kEmpty): something outside the job")
