"""The Debian package on a real Debian 12 host (lab/blockstack_lab/debian_host.py: systemd as PID 1,
udev, LVM with udev, apt), as an operator meets it (`make test-vm-long`; results in BENCHMARKS.md):

1. the previous build installed with `apt-get install ./…deb` (its dependencies from the lab's local
   repository of Debian's packages): every unit it lists active, every port answered;
2. an upgrade to this build keeps an edited conffile and the data (TSDB, pages);
3. the NVMe incident (a 4 KiB-chunk LVM snapshot on NVMe, nomerges=2 beneath it) pages through the
   packaged stack, systemd's services alone, and nomerges=0 resolves it;
4. a reboot brings every unit back;
5. every persist recipe the doctor prints (`--json`, automatic ones) applied, the guest rebooted:
   each finding whose recipe says it clears is gone, each `verify` passes; a device setting set
   wrong by hand is put right again by a udev `change` event;
6. the inverse: a udev rule that sets nomerges=2 again, named by the doctor;
7. `apt-get purge` leaves no user, unit, file or process;
8. the exporters alone (blockstack-merges-exporters): installed, every unit active, no server, purged
   as cleanly.

Each step's seconds and outcome go to .build/test-debian-package.json (docs/persist.md's last
column and BENCHMARKS.md are written from it).
"""

import json
import os
import re
import shlex
import subprocess
import time

import pytest

from blockstack_lab import debian_host, vm_scenarios
from blockstack_lab.debian_host import DebianHost
from blockstack_testsupport.clock import wait_until

pytestmark = [pytest.mark.vm_long, pytest.mark.root]

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VERSION = open(os.path.join(REPO, "VERSION")).read().strip()
PREVIOUS = "0.0.9"
PACKAGE = "blockstack-merges"
STATE = "/var/lib/blockstack-merges"
CONF = "/etc/blockstack-merges/blockstack-merges.conf"
PAGES = f"{STATE}/pages/pages.jsonl"
RESULTS = os.path.join(REPO, ".build", "test-debian-package.json")
# The packaged stack's ports in the guest (packaging/debian/blockstack-merges.conf: off Debian's own
# node_exporter, Prometheus and Alertmanager); what each must answer.
EXPORTER_PORTS = {"node": 9110, "blockstack": 9363, "ebpf": 9435}
SERVER_PORTS = {"prometheus": 9190, "alertmanager": 9193, "receiver": 9466, "receiver-self": 9467}
EXPORTER_TIMEOUT = 900  # the VM lab allows 20 min for the BPF probe (vm.Guest.ebpf_configs)
PAGE_TIMEOUT = 600  # TCG: Prometheus, Alertmanager and the exporters all in the guest
MARK = "# edited by test_debian_package: an upgrade keeps this line"


def build(out, version):
    subprocess.run(
        [os.path.join(REPO, "packaging", "build-deb.sh"), out, version], check=True, timeout=600
    )
    return os.path.join(out, f"{PACKAGE}_{version}-1_amd64.deb")


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("debs"))
    previous, current = build(out, PREVIOUS), build(out, VERSION)
    return previous, current, os.path.join(out, f"{PACKAGE}-exporters_{VERSION}-1_amd64.deb")


class Steps(dict):
    """{step: {"seconds": s, ...}}, written to RESULTS after each step (a failed run keeps the
    steps it made)."""

    def __init__(self):
        super().__init__()
        self.start = time.monotonic()

    def end(self, name, **facts):
        now = time.monotonic()
        self[name] = {"seconds": round(now - self.start, 1), **facts}
        self.start = now
        print(f"step {name}: {self[name]}", flush=True)
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS, "w") as f:
            json.dump(self, f, indent=1)


def units(host):
    return host.run(f"cat {STATE}/units.list").stdout.split()


def all_active(host, timeout=300, servers=SERVER_PORTS):
    """Every unit of units.list active (the .socket units listening), and every port answered: the
    exporters with metrics, the servers with any HTTP status (they ask for credentials)."""
    names = units(host)
    assert names, "no units listed"

    def active():
        states = {u: host.unit_active(u) for u in names}
        return states if all(s == "active" for s in states.values()) else None

    try:
        wait_until("every unit active", active, timeout, 3)
    except TimeoutError:
        print(
            host.run(
                "systemctl --no-pager status 'blockstack-*' | tail -60; journalctl -n 60 --no-pager",
                check=False,
            ).stdout
        )
        raise
    answered = {}
    for name, port in EXPORTER_PORTS.items():
        try:  # ebpf_exporter loads its programs first: minutes under TCG
            body = wait_until(
                f"{name} on {port}",
                lambda: host.run(f"curl -sf http://127.0.0.1:{port}/metrics", check=False).stdout,
                EXPORTER_TIMEOUT,
                3,
            )
        except TimeoutError:
            print(host.run("journalctl -n 80 --no-pager -u 'blockstack-*'", check=False).stdout)
            raise
        answered[name] = len(body.splitlines())
    for name, port in servers.items():
        code = wait_until(
            f"{name} on {port}",
            lambda: (
                host.run(
                    f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/",
                    check=False,
                ).stdout.strip()
                not in ("", "000")
                and host.run(
                    f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/",
                    check=False,
                ).stdout.strip()
            ),
            120,
            3,
        )
        answered[name] = code
    return names, answered


def pages(host):
    out = host.run(f"cat {PAGES} 2>/dev/null", check=False).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def collapse_pages(host, status):
    """The receiver's notifications of BlockStackMergeCollapse on nvme0n1 with `status`."""
    found = []
    for record in pages(host):
        for alert in record.get("notification", {}).get("alerts", []):
            labels = alert.get("labels", {})
            if (
                labels.get("alertname") == "BlockStackMergeCollapse"
                and labels.get("device") == "nvme0n1"
                and alert.get("status") == status
            ):
                found.append(alert)
    return found


def doctor(host):
    """blockstack-doctor --json in the guest: the report; findings keyed (check, device name) with
    dm-N named by its dm name (numbers change across boots)."""
    report = json.loads(host.run("blockstack-doctor --json", check=False, timeout=600).stdout)
    names = vm_scenarios.dm_names(host)
    by_dev = {dev: name for name, dev in names.items()}
    return {(f["check"], by_dev.get(f["device"], f["device"])): f for f in report["findings"]}


def test_package_on_a_debian_host(debs):
    previous, current, exporters = debs
    steps = Steps()
    # the exporters' package conflicts with the full one and needs a subset of its dependencies
    repo = debian_host.build_repo((*debian_host.REPO_PACKAGES, previous, current))
    steps.end("local repository of Debian's packages")
    with DebianHost("6.1", nvme=1, repo=repo, say=print) as host:
        steps.end("boot", boot_seconds=round(host.boot_seconds, 1))

        # 1. the previous build, with Debian's Prometheus and Alertmanager (Recommends)
        guest_prev = host.copy_in(previous, "/root/")
        host.apt_install(guest_prev, "prometheus", "prometheus-alertmanager")
        steps.end(f"apt-get install ./{os.path.basename(previous)}")
        names, answered = all_active(host)
        ebpf = host.run(
            f"cat $(find {STATE} -name ebpf-status.tsv)", check=False
        ).stdout.splitlines()
        steps.end(
            "every unit active, every port answered",
            units=names,
            answered=answered,
            ebpf_status=ebpf,
        )
        assert host.run(f"dpkg-query -W -f '${{Version}}' {PACKAGE}").stdout == f"{PREVIOUS}-1"
        # ebpf_exporter as the package runs it (its own user, CAP_BPF and CAP_PERFMON) on Debian's
        # 6.1 (kernel.perf_event_paranoid=3) runs the batched block_io: its flush is a BPF timer
        # (a perf event until 2026-11-27, which paranoid 3 refused it: block_io_immediate ran)
        assert any(line.startswith("block\tblock_io\t") for line in ebpf), ebpf

        # 2. upgrade: an edited conffile and the data stay
        host.run(f"echo {shlex.quote(MARK)} >> {CONF}")
        tsdb = re.search(
            r"--storage\.tsdb\.path=(\S+)", host.run("systemctl cat blockstack-prometheus").stdout
        )[1]
        wait_until(
            "Prometheus' TSDB written",
            lambda: host.run(f"ls {tsdb}/wal", check=False).stdout.strip(),
            120,
            3,
        )
        host.run(
            f"echo kept > {STATE}/pages/upgrade-marker"
        )  # beside the pages file, not in it (the receiver owns that)
        before = host.run(f"ls {tsdb}/wal; cat {STATE}/secrets/* 2>/dev/null | md5sum").stdout
        guest_cur = host.copy_in(current, "/root/")
        host.run(
            ["apt-get", "install", "-y", "-q", "-o", "Dpkg::Options::=--force-confold", guest_cur],
            timeout=900,
        )
        assert host.run(f"dpkg-query -W -f '${{Version}}' {PACKAGE}").stdout == f"{VERSION}-1"
        assert MARK in host.run(f"cat {CONF}").stdout
        assert host.run(f"cat {STATE}/pages/upgrade-marker").stdout == "kept\n"
        after = host.run(f"ls {tsdb}/wal; cat {STATE}/secrets/* 2>/dev/null | md5sum").stdout
        assert set(before.split()) <= set(after.split()), (before, after)
        names, answered = all_active(host)
        steps.end(
            f"upgrade {PREVIOUS} -> {VERSION}: conffile edit, TSDB, pages and secrets kept",
            units=names,
        )

        # 3. the NVMe incident pages through the packaged stack, and its fix resolves it
        vm_scenarios.build_snapshot(host)
        host.run("udevadm settle")
        steps.end("LVM snapshot (4 KiB chunks) on nvme0n1")
        with host.background(["sh", "-c", vm_scenarios.SNAPSHOT_READS]):
            time.sleep(60)  # healthy reads, rate windows filling
            assert not collapse_pages(host, "firing"), "paged at nomerges=0"
            host.run("echo 2 > /sys/block/nvme0n1/queue/nomerges")
            onset = time.monotonic()
            fired = wait_until(
                "BlockStackMergeCollapse on nvme0n1",
                lambda: collapse_pages(host, "firing"),
                PAGE_TIMEOUT,
                10,
            )
            steps.end(
                "nomerges=2: paged",
                onset_to_page=round(time.monotonic() - onset, 1),
                summary=fired[0].get("annotations", {}).get("summary"),
            )
            host.run("echo 0 > /sys/block/nvme0n1/queue/nomerges")
            fix = time.monotonic()
            wait_until(
                "the page resolved", lambda: collapse_pages(host, "resolved"), PAGE_TIMEOUT, 10
            )
            steps.end(
                "nomerges=0: resolved",
                fix_to_resolved=round(time.monotonic() - fix, 1),
                firing_notifications=len(collapse_pages(host, "firing")),
            )
        host.run(f"umount {vm_scenarios.MNT_SNAP}", check=False)

        # 4. a reboot: every unit back
        seconds = host.reboot()
        names, answered = all_active(host)
        steps.end("reboot: every unit back", reboot_seconds=round(seconds, 1))

        # 5. the persist recipes, applied and rebooted
        host.run(
            "echo 2 > /sys/block/nvme0n1/queue/nomerges; echo 64 > /sys/block/nvme0n1/queue/max_sectors_kb"
        )
        found = doctor(host)
        recipes = {key: f["recipes"][0] for key, f in found.items() if f.get("recipes")}
        table = {}
        for (check, device), recipe in recipes.items():
            row = {
                "how": recipe["how"],
                "automatic": recipe["automatic"],
                "clears": recipe["clears"],
            }
            if recipe["automatic"]:
                r = host.run(["sh", "-e", "-c", recipe["command"]], check=False, timeout=600)
                row["applied"] = r.rc == 0
                if r.rc:
                    row["error"] = (r.stdout + r.stderr)[-400:]
            table[f"{check} {device}"] = row
        steps.end(
            "persist recipes applied", findings=sorted(f"{c} {d}" for c, d in found), recipes=table
        )
        host.reboot()
        host.run("udevadm settle")
        found_after = doctor(host)
        for (check, device), recipe in recipes.items():
            row = table[f"{check} {device}"]
            if not row.get("applied"):
                continue
            row["after_reboot_gone"] = (check, device) not in found_after
            if recipe.get("verify"):
                row["verify"] = host.run(["sh", "-c", recipe["verify"]], check=False).rc == 0
        # a device setting put wrong by hand: the udev rule puts it right on the next change event
        host.run(
            "echo 2 > /sys/block/nvme0n1/queue/nomerges; udevadm trigger --action=change "
            "--subsystem-match=block --sysname-match=nvme0n1 && udevadm settle"
        )
        nomerges_after_change = host.run("cat /sys/block/nvme0n1/queue/nomerges").stdout.strip()
        steps.end(
            "rebooted: findings again", recipes=table, nomerges_after_change=nomerges_after_change
        )
        for key, row in table.items():
            if row.get("applied") is False:
                pytest.fail(f"{key}: the recipe failed: {row}")
            if row.get("applied") and row["clears"]:
                assert row["after_reboot_gone"], (key, row)
            if "verify" in row:
                assert row["verify"], (key, row)
        assert any(r.get("applied") for r in table.values()), table
        assert nomerges_after_change == "0"

        # 6. the inverse: a udev rule of someone else's sets nomerges=2 again; the doctor names it
        host.run(
            """printf '%s\\n' 'ACTION=="add|change", SUBSYSTEM=="block", KERNEL=="nvme0n1", ATTR{queue/nomerges}="2"' """
            "> /etc/udev/rules.d/99-local-tuning.rules && udevadm control --reload && "
            "udevadm trigger --action=change --subsystem-match=block --sysname-match=nvme0n1 && udevadm settle"
        )
        assert host.run("cat /sys/block/nvme0n1/queue/nomerges").stdout.strip() == "2"
        finding = doctor(host).get(("nomerges_beneath_stack", "nvme0n1")) or doctor(host).get(
            ("nomerges", "nvme0n1")
        )
        assert finding, "nomerges=2 not reported"
        named = [e for e in finding["evidence"] if "99-local-tuning.rules" in e]
        assert named, finding["evidence"]
        steps.end(
            "inverse: the doctor names the rule that sets nomerges=2 again", evidence=named[0]
        )

        # 7. purge: no user, unit, file or process
        host.run(["apt-get", "purge", "-y", "-q", PACKAGE], timeout=900)
        left = leftovers(host)
        steps.end("apt-get purge", left=left)
        assert left == NOTHING, left

        # 8. the exporters alone, for a host whose own Prometheus scrapes them; purged as cleanly
        host.apt_install(host.copy_in(exporters, "/root/"))
        names, answered = all_active(host, servers={})
        steps.end(
            f"apt-get install ./{os.path.basename(exporters)}", units=names, answered=answered
        )
        assert not [u for u in names if re.search(r"prometheus|alertmanager|receiver", u)], names
        host.run(["apt-get", "purge", "-y", "-q", f"{PACKAGE}-exporters"], timeout=900)
        left = leftovers(host)
        steps.end("apt-get purge of the exporters", left=left)
        assert left == NOTHING, left
    steps.end("power-off")


NOTHING = {"users": [], "groups": [], "units": [], "files": [], "processes": []}


def leftovers(host):
    """What of the package is left in the guest: users, groups, units, files, processes."""
    left = {
        "users": host.run(
            "getent passwd | cut -d: -f1 | grep '^blockstack' || true"
        ).stdout.split(),
        "groups": host.run(
            "getent group | cut -d: -f1 | grep '^blockstack' || true"
        ).stdout.split(),
        "units": host.run(
            "ls /etc/systemd/system | grep '^blockstack-' || true; "
            "systemctl list-units --all --no-legend --plain 'blockstack-*' | cut -d' ' -f1"
        ).stdout.split(),
        "files": host.run(
            f"ls -d {STATE} /etc/blockstack-merges /usr/lib/blockstack-merges /run/blockstack-merges "
            "2>/dev/null || true"
        ).stdout.split(),
        "processes": host.run(
            "ps -eo user:32,comm --no-headers | grep '^blockstack' || true"
        ).stdout.splitlines(),
    }
    left["units"] = sorted({u for u in left["units"] if u != debian_host.AGENT_UNIT})
    return left
