"""The chart's pod, as rendered, run by podman on this host (podkit.py maps each field of the pod
spec to podman): ebpf_exporter loads, attaches and counts a loop device's I/O with CAP_BPF,
CAP_PERFMON and the chart's seccomp profile; blockstack-exporter and node_exporter report the
loop device as nobody with no capability, and blockstack-exporter, with the host's /proc, an ext4
filesystem mounted on the host as the package's exporter on the host does; the dm helper holds
nothing where the kernel has no device-mapper. Then the ablation: each capability and each seccomp allowance taken away in turn,
and what breaks, written into docs/kubernetes.md (BLOCKSTACK_UPDATE_DOCS=1 rewrites the table;
without it the test fails when the table differs from what it measured).

Needs root (podman, loop devices), the image (`make chart-image`) and helm (`make helm`).
"""

import contextlib
import ctypes
import json
import os
import re
import subprocess
import time

import podkit
import pytest
import seccomp_profile
from prometheus_client.parser import text_string_to_metric_families

from blockstack_deploy import privileges
from blockstack_deploy.stack import program
from blockstack_exporter.collectors.stack import encode_dev
from blockstack_lab import loop
from blockstack_testsupport import procs
from blockstack_testsupport.clock import wait_until

pytestmark = [pytest.mark.root, pytest.mark.built]

LIB = "/usr/lib/blockstack-merges"
EXPORTER = f"{LIB}/build/bin/ebpf_exporter"
CONFIG_DIR = f"{LIB}/build/ebpf-configs"
SELECT = f"{LIB}/ebpf-configs/select-configs.sh"
PROFILE = os.path.join(podkit.CHART, "files", "seccomp", "ebpf-exporter.json")
ALLOWED = ("bpf",)  # what the chart's profile adds to podman's default
CAPS = ("BPF", "PERFMON")
CAP_BIT = {"BPF": 39, "PERFMON": 38, "SYS_ADMIN": 21}  # include/uapi/linux/capability.h
DOC = os.path.join(podkit.REPO, "docs", "kubernetes.md")
BEGIN = "<!-- ablation table: charts/tests/test_podman.py writes it -->"
END = "<!-- end of the ablation table -->"
# The line of ebpf_exporter's output that says how a check ended (timestamps and paths vary).
OUTCOME = re.compile(
    r"Config check successful"
    r"|Couldn't load trivial BPF program"
    r"|prog '[^']+': BPF program load failed: [A-Za-z ]+"
    r"|Missed attachments \(module:prog\): [\w:, ]+"
)


@pytest.fixture(scope="module", autouse=True)
def ready():
    missing = [p for p in (podkit.HELM,) if not os.path.exists(p)]
    if missing:
        pytest.fail(f"not built (run `make helm`): {', '.join(missing)}")
    if not podkit.image_present():
        pytest.fail(f"no image {podkit.IMAGE} (run `make chart-image`)")


@pytest.fixture(scope="module")
def pod():
    """The whole pod: every container the chart has, node_exporter and the dm helper included."""
    with podkit.pod(["nodeExporter.enabled=true", "dm.enabled=true"]) as p:
        for c in ("ebpf-exporter", "blockstack-exporter", "dm-helper", "node-exporter"):
            p.start(c)
        wait_for(lambda: "Listening on" in p.logs("ebpf-exporter"), p, "ebpf-exporter")
        wait_for(lambda: "listening on" in p.logs("blockstack-exporter"), p, "blockstack-exporter")
        yield p


def wait_for(condition, pod, container, timeout=120):
    try:
        wait_until(f"{container} to start", condition, timeout, 0.5)
    except TimeoutError as e:
        pytest.fail(f"{e}:\n{pod.logs(container)[-3000:]}")


def samples(text):
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def caps_mask(*names):
    return f"{sum(1 << CAP_BIT[n] for n in names):016x}"


def test_profile_is_podmans_default_with_bpf():
    """The chart's profile is exactly podman's default for a container with CAP_BPF and
    CAP_PERFMON, with bpf allowed: regenerated here, compared."""
    default = podkit.load_json(podkit.PODMAN_DEFAULT_SECCOMP)
    caps = {f"CAP_{c}" for c in CAPS}
    assert podkit.load_json(PROFILE) == seccomp_profile.profile(default, caps, ALLOWED)
    refused = [r for r in default["syscalls"] if "bpf" in r["names"]]
    assert all(
        r.get("includes", {}).get("caps") == ["CAP_SYS_ADMIN"]
        for r in refused
        if r["action"] == "SCMP_ACT_ALLOW"
    ), "podman's default allows bpf() otherwise now"


def test_init_container_installs_the_profile(pod):
    installed = pod.seccomp_path(pod.security(pod.container("ebpf-exporter"))["seccompProfile"])
    assert podkit.load_json(installed) == podkit.load_json(PROFILE)


def test_ebpf_exporter_attaches_and_counts_a_collapse(pod):
    """A loop-lab collapse: max_sectors_kb 4 and nomerges 2 on a loop device read in 1 MiB
    direct reads; ebpf_exporter counts every 4 KiB request and every piece split off, and
    blockstack-exporter reports the settings that caused it."""
    st = pod.status("ebpf-exporter")
    assert st["Uid"].split()[0] == "0"
    assert st["CapBnd"] == caps_mask(*CAPS)
    assert st["CapEff"] == "0" * 16  # all dropped once attached (--capabilities.keep=none)
    assert st["NoNewPrivs"] == "1"
    assert st["Seccomp"] == "2"  # filtered by the profile
    status = pod.read("run", "ebpf-status.tsv")
    assert re.search(r"^block\tblock_io", status, re.M), status
    assert "fanotify not available" in pod.logs("ebpf-exporter")  # refused, not needed (below)
    mib = 32
    with (
        loop.attached(64 << 20) as dev,
        loop.sysfs_setting(dev, "queue/max_sectors_kb", 4),
        loop.sysfs_setting(dev, "queue/nomerges", 2),
    ):
        rdev = os.stat(dev).st_rdev
        devno = str(encode_dev(os.major(rdev), os.minor(rdev)))

        def counts():
            text = pod.http_get(9435, via="blockstack-exporter")
            got = {"requests": 0, "bytes": 0, "splits": 0}
            for s in samples(text):
                if s.labels.get("devno") != devno or s.labels.get("operation") != "read":
                    continue
                if s.name == "ebpf_exporter_block_rq_size_bytes_count":
                    got["requests"] += s.value
                elif s.name == "ebpf_exporter_block_rq_size_bytes_sum":
                    got["bytes"] += s.value
                elif s.name == "ebpf_exporter_block_bio_splits_total":
                    got["splits"] += s.value
            return got

        before = counts()
        subprocess.run(
            ["dd", f"if={dev}", "of=/dev/null", "bs=1M", f"count={mib}", "iflag=direct"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        want = {"requests": mib * 256, "bytes": mib << 20, "splits": mib * 255}
        # block_io flushes each CPU's counts within 0.5 s of its first, but this machine's
        # hypervisor runs an idle CPU's timer only when the CPU runs again (ebpf_testlib.settle):
        # each scrape here starts processes, which wakes them
        delta = {}

        def counted():
            after = counts()
            delta.update((k, after[k] - before[k]) for k in want)
            return all(delta[k] >= want[k] for k in want)

        with contextlib.suppress(TimeoutError):
            wait_until(f"{dev}'s reads in ebpf_exporter's counts", counted, 15, 0.5)
        settings = pod.http_get(9363, via="blockstack-exporter")
    assert all(delta[k] >= want[k] for k in want), f"{dev} (devno {devno}): {delta}, want {want}"
    assert f'blockstack_queue_max_sectors_bytes{{device="{loop.name(dev)}"}} 4096.0' in settings
    assert f'blockstack_queue_nomerges{{device="{loop.name(dev)}"}} 2.0' in settings


def test_blockstack_exporter_reports_the_stack(pod):
    st = pod.status("blockstack-exporter")
    assert st["Uid"].split()[0] == "65534"
    assert st["CapBnd"] == st["CapEff"] == "0" * 16
    with loop.attached(64 << 20) as dev:
        name = loop.name(dev)
        text = pod.http_get(9363, via="blockstack-exporter")
    got = samples(text)
    assert any(
        s.name == "blockstack_queue_nomerges" and s.labels.get("device") == name for s in got
    )
    assert any(
        s.labels.get("device") == name and s.name.startswith("blockstack_device") for s in got
    )
    failed = [
        s.labels for s in got if s.name == "blockstack_scrape_collector_success" and not s.value
    ]
    assert not failed, failed


@contextlib.contextmanager
def host_exporter():
    """blockstack-exporter on this host as the Debian package runs it: its user
    blockstack-exporter in group disk (which reads the ext4 superblocks), no capability, the host's
    own /proc, /sys and /dev (privileges.wrap: the identity of the package's unit and of `make
    up`). Yields a function that scrapes it."""
    privileges.ensure_users()
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    argv = [program("blockstack"), f"--web.listen-address=127.0.0.1:{port}"]
    with procs.running(privileges.wrap("blockstack", argv), health_url=url):
        yield lambda: procs.http_get(url, timeout=20)


def of_device(text, prefix, device):
    """{(name, labels, value)} of the series named prefix* whose `device` is device."""
    return {
        (s.name, frozenset(s.labels.items()), s.value)
        for s in samples(text)
        if s.name.startswith(prefix) and s.labels.get("device") == device
    }


def test_blockstack_exporter_sees_the_hosts_mounts(pod, tmp_path):
    """With the host's /proc (read-only, nothing else of the host), the pod reports an ext4
    filesystem mounted on the host as the package does on the host itself: every option under
    the host's mountpoint, and the journal size (16 MiB, not mke2fs's default for the size), which
    the package reads from the superblock and the pod, without /dev/loopN, derives from
    /proc/fs/jbd2 and mb_structs_summary. A loop device over a file on that filesystem is placed
    on it in both, and both run the same collectors."""
    mounts = pod.exec("blockstack-exporter", "cat", "/proc/self/mountinfo").stdout
    bound = [line.split() for line in mounts.splitlines() if line.split()[4] == "/host/proc"]
    assert len(bound) == 1 and "ro" in bound[0][5].split(","), mounts
    journal = 16 << 20
    with (
        loop.attached(256 << 20, directory=str(tmp_path)) as lower,
        loop.ext4(lower, ["-b", "4096", "-J", "size=16"], directory=str(tmp_path)) as mnt,
        _upper(mnt) as upper,
        host_exporter() as scrape_host,
    ):
        in_pod = pod.http_get(9363, via="blockstack-exporter")
        on_host = scrape_host()
    lo, up = loop.name(lower), loop.name(upper)

    ext4 = of_device(in_pod, "blockstack_ext4_", lo)
    assert ext4 == of_device(on_host, "blockstack_ext4_", lo)
    assert {dict(labels)["mountpoint"] for _, labels, _ in ext4} == {mnt}
    sizes = {v for name, _, v in ext4 if name == "blockstack_ext4_journal_size_bytes"}
    assert sizes == {journal}, sorted(ext4)
    # jbd2's series of its journal: the same in both (their values move with its commits)
    jbd2 = [
        {(n, ls) for n, ls, _ in of_device(t, "blockstack_jbd2_", lo)} for t in (in_pod, on_host)
    ]
    assert jbd2[0] and jbd2[0] == jbd2[1], jbd2

    backing = os.path.join(mnt, "upper.img")
    for text in (in_pod, on_host):
        info = [
            s.labels
            for s in samples(text)
            if s.name == "blockstack_device_info" and s.labels.get("device") == up
        ]
        assert [i["backing_file"] for i in info] == [backing], info
        assert f'blockstack_device_lower_info{{device="{up}",lower="{lo}"}} 1.0' in text

    def collectors(text):
        return {
            s.labels["collector"]
            for s in samples(text)
            if s.name == "blockstack_scrape_collector_success"
        }

    assert collectors(in_pod) == collectors(on_host)


def _upper(mnt):
    """A loop device over a sparse file on the mounted filesystem."""
    path = os.path.join(mnt, "upper.img")
    with open(path, "wb") as f:
        f.truncate(32 << 20)
    return loop.attached(path=path)


def test_node_exporter_reports_loop_devices(pod):
    st = pod.status("node-exporter")
    assert st["Uid"].split()[0] == "65534"
    assert st["CapBnd"] == st["CapEff"] == "0" * 16
    with loop.attached(64 << 20) as dev:
        text = pod.http_get(9100, via="blockstack-exporter")
    assert f'node_disk_reads_completed_total{{device="{loop.name(dev)}"}}' in text


def test_dm_helper_holds_only_what_device_mapper_needs(pod):
    """Privileged as a container (nothing else opens /dev/mapper/control in Kubernetes), its
    process holds CAP_SYS_ADMIN alone where the kernel has device-mapper, nothing where not."""
    st = pod.status("dm-helper")
    with open("/proc/devices") as f:
        has_dm = "device-mapper" in f.read().split() and os.path.exists("/dev/mapper/control")
    want = caps_mask("SYS_ADMIN") if has_dm else "0" * 16
    assert (st["CapBnd"], st["CapEff"], st["NoNewPrivs"]) == (want, want, "1")
    if not has_dm:
        assert "no device-mapper on this node" in pod.logs("dm-helper")


# --- the ablation --------------------------------------------------------------------------------

# (what changes in the ebpf-exporter container, capabilities, seccomp: the allowances of the
# chart's profile kept, or "RuntimeDefault"); the expected outcome of the check and of the choice.
ABLATIONS = [
    ("as rendered", CAPS, ALLOWED),
    ("without CAP_BPF", ("PERFMON",), ALLOWED),
    ("without CAP_PERFMON", ("BPF",), ALLOWED),
    ("seccomp: bpf refused", CAPS, ()),
    ("seccomp: RuntimeDefault (podman's default)", CAPS, "RuntimeDefault"),
]
EXPECTED = {
    "as rendered": ("Config check successful", "block_io, jbd2_credit_wait"),
    "without CAP_BPF": ("Couldn't load trivial BPF program", "none"),
    "without CAP_PERFMON": (
        "prog 'block_bio_queue': BPF program load failed: Operation not permitted",
        None,  # recorded in the table, not asserted: it depends on the kernel's variants
    ),
    "seccomp: bpf refused": ("Couldn't load trivial BPF program", "none"),
    "seccomp: RuntimeDefault (podman's default)": ("Couldn't load trivial BPF program", "none"),
}


def ablated(pod, caps, seccomp):
    ctx = json.loads(json.dumps(pod.security(pod.container("ebpf-exporter"))))
    ctx["capabilities"]["add"] = list(caps)
    if seccomp == "RuntimeDefault":
        ctx["seccompProfile"] = {"type": "RuntimeDefault"}
    elif tuple(seccomp) != ALLOWED:
        name = f"blockstack-merges/ablation-{'-'.join(seccomp) or 'none'}.json"
        default = podkit.load_json(podkit.PODMAN_DEFAULT_SECCOMP)
        with open(os.path.join(pod.kubelet_root, "seccomp", name), "w") as f:
            json.dump(seccomp_profile.profile(default, {"CAP_BPF", "CAP_PERFMON"}, seccomp), f)
        ctx["seccompProfile"] = {"type": "Localhost", "localhostProfile": name}
    return ctx


def outcome(text):
    m = OUTCOME.search(text)
    return m.group(0).strip() if m else text.strip().splitlines()[-1]


def test_ablation(pod):
    """Each capability and each seccomp allowance taken away in turn: the check fails where it
    must, select-configs.sh falls back or loads nothing, and the table in docs/kubernetes.md is
    what was measured."""
    status = pod.read("run", "ebpf-status.tsv")
    names = ",".join(
        line.split("\t")[1] for line in status.splitlines() if line.split("\t")[1] != "-"
    )
    rows = []
    for change, caps, seccomp in ABLATIONS:
        ctx = ablated(pod, caps, seccomp)
        check = pod.run(
            "ebpf-exporter",
            [
                EXPORTER,
                f"--config.dir={CONFIG_DIR}",
                f"--config.names={names}",
                "--config.check",
                "--config.strict",
            ],
            security=ctx,
        )
        select = pod.run("ebpf-exporter", [SELECT, EXPORTER, CONFIG_DIR], security=ctx)
        got = (
            outcome(check.stdout + check.stderr),
            select.stdout.strip().replace(",", ", ") or "none",
        )
        want_check, want_select = EXPECTED[change]
        assert got[0] == want_check, f"{change}: {check.stdout}{check.stderr}"
        assert (check.returncode == 0) == (change == "as rendered"), change
        if want_select is not None:
            assert got[1] == want_select, f"{change}: {select.stderr}"
        caps_text = ", ".join(f"CAP_{c}" for c in caps)
        profile = (
            "podman's default"
            if seccomp == "RuntimeDefault"
            else "default + " + ", ".join(seccomp)
            if seccomp
            else "default"
        )
        rows.append(f"| {change} | {caps_text} | {profile} | {got[0]} | {got[1]} |")
    table = "\n".join(
        [
            BEGIN,
            f"| ebpf-exporter container | capabilities | seccomp | `--config.check --config.strict`"
            f" ({names.replace(',', ', ')}) | select-configs.sh picks |",
            "| --- | --- | --- | --- | --- |",
            *rows,
            END,
        ]
    )
    with open(DOC) as f:
        doc = f.read()
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    if os.environ.get("BLOCKSTACK_UPDATE_DOCS") == "1":
        with open(DOC, "w") as f:
            f.write(doc[:start] + table + doc[end:])
    else:
        assert doc[start:end] == table, "docs/kubernetes.md's ablation table differs from this run"


# --- how the allowances were found ---------------------------------------------------------------

AUDIT = re.compile(r'type=1326 .*comm="ebpf_exporter" .*arch=c000003e syscall=(\d+)')
# fanotify_init: ebpf_exporter watches cgroups with it for its cgroup label decoder, which none
# of our configs uses; refused, it says "fanotify not available" and resolves them on demand.
NOT_NEEDED = {"fanotify_init"}


def syscall_name(number):
    """x86_64 syscall number -> name, by libseccomp (installed with runc)."""
    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_void_p
    arch_x86_64 = 0xC000003E  # AUDIT_ARCH_X86_64
    ptr = lib.seccomp_syscall_resolve_num_arch(arch_x86_64, number)
    name = ctypes.string_at(ptr).decode()
    ctypes.CDLL(None).free(ctypes.c_void_p(ptr))
    return name


def refused_syscalls(allow):
    """Run the ebpf-exporter container as rendered (select-configs.sh, then serving, one scrape)
    under podman's default profile with `allow` allowed and every refusal only logged
    (seccomp_profile --log); the syscalls of ebpf_exporter the kernel logged."""
    default = podkit.load_json(podkit.PODMAN_DEFAULT_SECCOMP)
    profile = seccomp_profile.profile(default, {"CAP_BPF", "CAP_PERFMON"}, allow, log=True)
    time.sleep(5)  # the kernel prints audit records under printk_ratelimit: 10 per 5 s
    with podkit.pod(name=f"bsm-derive-{len(allow)}") as p:
        path = os.path.join(p.kubelet_root, "seccomp", "blockstack-merges", "log.json")
        with open(path, "w") as f:
            json.dump(profile, f)
        ctx = json.loads(json.dumps(p.security(p.container("ebpf-exporter"))))
        ctx["seccompProfile"]["localhostProfile"] = "blockstack-merges/log.json"
        kmsg = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.lseek(kmsg, 0, os.SEEK_END)
            p.start("ebpf-exporter", security=ctx)
            wait_for(lambda: "Listening on" in p.logs("ebpf-exporter"), p, "ebpf-exporter")
            p.http_get(9435, via="ebpf-exporter")
            p.stop()
            records = []
            while True:
                try:
                    records.append(os.read(kmsg, 8192).decode(errors="replace"))
                except BlockingIOError:
                    break
        finally:
            os.close(kmsg)
    return {syscall_name(int(m.group(1))) for r in records for m in [AUDIT.search(r)] if m}


def test_the_allowances_are_what_ebpf_exporter_is_refused():
    """Derived by running, not by reading: the container under podman's default profile with
    every refusal logged, what it logs allowed, again until nothing new is logged. What it was
    refused is bpf, which the chart allows, and fanotify_init, which it does not need (the
    ablation shows bpf is needed). perf_event_open was refused too until block_io's flush became
    a BPF timer (2026-11-27): no program of ours is a perf event now."""
    allow, rounds = set(), 0
    while rounds < 4:
        new = refused_syscalls(tuple(sorted(allow))) - allow
        if not new:
            break
        allow |= new
        rounds += 1
    assert allow == set(ALLOWED) | NOT_NEEDED, allow
