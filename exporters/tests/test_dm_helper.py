"""The dm collector through the privileged helper (dm_helper.py): the real helper process on a
Unix socket, tests/fake_dmsetup as its dmsetup. The exporter publishes what it publishes when it
runs dmsetup itself; a helper that is down, failing or slow is an error count, never a crash; a
request other than its two names runs nothing."""

import os
import socket
import subprocess
import sys
import time

import pytest
from exporter_testlib import FAKE_DMSETUP, Scraped, registry_for
from test_dm import (
    DM_FIXTURES,
    DM_ONLY,
    STATUS,
    SYSFS,
    build_sysfs,
    in_queue_turn,
    incident_snapshot_info,
    status_started,
)

from blockstack_testsupport.clock import seconds, wait_until


@pytest.fixture
def helper(tmp_path):
    """start(scenario, **fake_dmsetup environment) -> the socket of a running helper; stopped after."""
    procs = []
    log = tmp_path / "dmsetup.log"

    def start(scenario, **env):
        sock = str(tmp_path / f"dm{len(procs)}.sock")
        env = dict(
            os.environ,
            FAKE_DMSETUP_FIXTURES=os.path.join(DM_FIXTURES, scenario),
            FAKE_DMSETUP_LOG=str(log),
            **{f"FAKE_DMSETUP_{k.upper()}": v for k, v in env.items()},
        )
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-m",
                    "blockstack_exporter.dm_helper",
                    f"--socket={sock}",
                    f"--dmsetup={FAKE_DMSETUP}",
                    "--timeout=2",
                ],
                env=env,
            )
        )
        helper = procs[-1]

        def listening():
            assert helper.poll() is None, f"the dm helper exited with {helper.returncode}"
            return os.path.exists(sock)

        wait_until("the dm helper's socket", listening, 30, 0.05)
        return sock

    start.calls = lambda: log.read_text().splitlines() if log.exists() else []
    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def registry(tmp_path, scenario, sock, timeout=5.0):
    root = tmp_path / "root"
    tree = str(root) if root.exists() else build_sysfs(str(root), SYSFS[scenario])
    return registry_for(
        tree,
        *DM_ONLY,
        f"--collector.dm.helper={sock}",
        f"--collector.dm.timeout={timeout}",
        "--collector.dm.dmsetup=/nonexistent/dmsetup",
    )  # the exporter runs no dmsetup


def scrape(tmp_path, scenario, sock, timeout=5.0):
    return Scraped(registry(tmp_path, scenario, sock, timeout))


def test_the_helper_answers_what_dmsetup_would(tmp_path, helper):
    r = scrape(tmp_path, "nvme-incident", helper("nvme-incident"))
    assert r.success("dm") == 1 and r.errors("dm") == 0
    snap = dict(device="dm-3", name="secvol-tmp_backup1")
    assert incident_snapshot_info(r) == 1
    assert r.get("blockstack_dm_snapshot_cow_used_bytes", **snap) == 208 * 512
    assert r.get("blockstack_dm_snapshot_state", **snap, state="valid") == 1
    assert [c.split(" ", 1)[1] for c in helper.calls()] == [
        "dmsetup table",
        "dmsetup status --noflush",
    ]


def test_the_helper_runs_the_table_again_only_when_its_events_say_so(tmp_path, helper):
    """The exporter asks for the helper's event token every scrape (dm.KeptTable), the table
    only when it changed or the devices did; the status every scrape (a snapshot)."""
    sock = helper("nvme-incident")
    exporter = registry(tmp_path, "nvme-incident", sock)
    first, second = Scraped(exporter), Scraped(exporter)
    assert incident_snapshot_info(first) == incident_snapshot_info(second) == 1
    assert second.success("dm") == 1 and second.errors("dm") == 0
    assert [c.split(" ", 1)[1] for c in helper.calls()] == [
        "dmsetup table",
        "dmsetup status --noflush",
        "dmsetup status --noflush",
    ]


def test_the_status_is_asked_of_the_helper_at_the_scrape_start(tmp_path, helper, monkeypatch):
    """As with dmsetup run here (test_dm): once the table is kept, the status request is sent
    when the scrape starts and its answer read in dm's turn. When the devices then turn out
    changed, the request is given up (its connection closed, the helper answers no one) and the
    table and the status asked for in turn; the helper serves on."""
    sock = helper("nvme-incident")
    root = build_sysfs(str(tmp_path / "root"), SYSFS["nvme-incident"])
    exporter = registry_for(root, *DM_ONLY, "--collector.queue", f"--collector.dm.helper={sock}")
    Scraped(exporter)
    started_in_queue_turn = []
    in_queue_turn(monkeypatch, lambda: started_in_queue_turn.append(status_started(helper, 2)))
    r = Scraped(exporter)
    assert started_in_queue_turn == [True]
    assert r.success("dm") == 1 and r.errors("dm") == 0 and incident_snapshot_info(r) == 1
    calls = [c.split(" ", 1)[1] for c in helper.calls()]
    assert calls == ["dmsetup table", STATUS, STATUS]
    monkeypatch.undo()
    build_sysfs(root, "dm dm-4 253:4 secvol-new")  # no event: begin() starts the status
    r = Scraped(exporter)
    assert r.success("dm") == 1 and r.errors("dm", "vanished") == 1  # dm-4: not in the listing
    assert incident_snapshot_info(r) == 1
    calls = [c.split(" ", 1)[1] for c in helper.calls()]
    assert calls[3:] == [STATUS, "dmsetup table", STATUS]
    assert Scraped(exporter).success("dm") == 1


@pytest.mark.parametrize(
    "env,reason,message",
    [
        (
            {"mode": "fail"},
            "command",
            "exited with 1: /dev/mapper/control: open failed: Permission denied",
        ),
        (
            {"mode": "hang", "sleep": "30"},
            "timeout",
            "timed out after 2s; killed",
        ),  # the helper's own timeout
    ],
)
def test_dmsetup_failing_in_the_helper_is_an_error_count(
    tmp_path, helper, caplog, env, reason, message
):
    r = scrape(tmp_path, "nvme-incident", helper("nvme-incident", **env))
    assert r.success("dm") == 0 and r.errors("dm", reason) == 1
    assert message in caplog.text


def test_a_helper_down_or_mute_is_an_error_count(tmp_path, caplog):
    r = scrape(tmp_path, "nvme-incident", str(tmp_path / "no-helper.sock"))
    assert r.success("dm") == 0 and r.errors("dm", "command") == 1
    assert "no-helper.sock: No such file or directory" in caplog.text
    # a socket nobody answers on: the exporter gives up at its timeout
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(tmp_path / "mute.sock"))
    mute.listen(1)
    with mute:
        start = time.monotonic()
        r = scrape(tmp_path, "nvme-incident", str(tmp_path / "mute.sock"), timeout=0.5)
        assert time.monotonic() - start < seconds(5)
    assert r.success("dm") == 0 and r.errors("dm", "timeout") == 1


def ask(sock, request):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(sock)
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    return reply


def test_the_helper_runs_nothing_but_its_two_requests(helper):
    sock = helper("nvme-incident")
    for request in (
        b"remove_all\n",
        b"table --help\n",
        b"status\x00message\n",
        b"../table\n",
        b"",
        b"x" * 16,
    ):
        assert ask(sock, request).startswith(b"error command\nunknown request"), request
    try:  # more than a request: read no further, answered or reset (seen by the sending side as a
        # broken pipe when the helper closed before the client's last write, else on the read)
        ask(sock, b"x" * 100000)
    except (ConnectionResetError, BrokenPipeError):
        pass
    assert ask(sock, b"events\n").startswith(b"ok\n")  # its event token: runs nothing either
    assert helper.calls() == []
    assert ask(sock, b"table\n").startswith(b"ok\nsecvol-seclv-real: 0 ")  # and it still serves
