"""The VM lab: a Debian kernel (6.1, 6.12, 5.10 or sid's) booted by virtme-ng under QEMU with software
emulation (TCG), with emulated NVMe devices on fresh images, for what this host's kernel cannot
show (device-mapper, LVM snapshots, fexit). `make vm-lab` runs the NVMe incident on it
(vm_scenarios.py); the `vm` test tier (lab/tests/test_vm_*.py) and the benchmarks use this API:

    with Guest("6.1", nvme=1) as g:                 # boots; everything undone on exit
        g.run("pvcreate /dev/nvme0n1")              # synchronous, as root in the guest; raises on rc != 0
        r = g.run(["cat", "/proc/diskstats"], check=False)   # Result(rc, stdout, stderr)
        with g.background(["fio", ...]) as job:     # a guest process while the body runs
            ...                                      # job.poll() -> (rc or None, output so far)
        with g.exporters() as ports:                # node, blockstack, ebpf exporters in the guest
            stack = HostStack(g, workdir, ports)     # Prometheus, Alertmanager, receiver on the host
            with stack.running(): ...

How the guest is made (the facts issue #20 measured):
- virtme-ng (`vng --run /boot/vmlinuz-VERSION --disable-kvm`) boots the kernel with its own
  initramfs and shows the guest the host's root read-only (9p) with tmpfs overlays, so the guest
  runs this very repository, its .venv, .build/bin/ebpf_exporter and Debian's binaries. KVM did
  not get past the firmware on this machine; TCG (-cpu max) works, about 10x slower than native.
- Each Guest has its own directory in /var/tmp (blockstack-vm-*): one fresh sparse image per NVMe
  device (`-device nvme`; nvme0n1, nvme1n1, ... in that order), the guest's start script, an
  lvm.conf and a token. LVM in the guest runs without udev (udev_sync = 0, udev_rules = 0,
  obtain_device_list_from_udev = 0) from that lvm.conf ($LVM_SYSTEM_DIR), not the host's /etc/lvm.
- Network: QEMU user networking, restricted (no way out of the guest), with host-forwarded TCP
  ports bound to 127.0.0.1 only: the agent (vm_agent.py, which runs the commands) and one per
  exporter. The guest brings up lo (no exporter listens without it) and eth0 as 10.0.2.15.
- ebpf_exporter runs as users run it (the Debian package, the Helm chart, `make up` as root):
  its own user with CAP_BPF and CAP_PERFMON (blockstack_deploy.privileges, through setpriv;
  the users made at boot as the package makes them, privileges.ensure_users), and
  select-configs.sh probes the variants under that identity (SELECT_CONFIGS_AS), at
  kernel.perf_event_paranoid as the distribution sets it (3 on Debian's kernels:
  distribution_paranoid, set at boot).
- virtme-ng's script output reaches the host only with --verbose (no virtio-serial port is used:
  console fallback); it and the kernel's console go to console.log in the guest's directory.
- On exit, or on any failure during the boot: the agent is asked to power the guest off; whatever
  is left of QEMU's process group is killed; the directory (images included) is removed.
  `sweep_stale` does the same for guests whose owning process was SIGKILLed.

Kernels differ (docs/kernels.md): as root the jbd2 fexit variant loads on 6.1, 6.12 and sid
(on this host's 6.18 only the tracepoint one; on 5.10, without task storage, only the legacy one);
under ebpf_exporter's production identity, without the modules' BTF, the legacy variant on 5.10
and 6.1 and the raw one from 6.2. Device-mapper accounts the split bios in its own
/proc/diskstats: a dm-snapshot with 4 KiB chunks shows 8-sector requests on dm-N at any nomerges,
so only the missed-merge counter and the bio sizes entering dm show the NVMe incident's contrast.
"""

import contextlib
import dataclasses
import glob
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from blockstack_deploy import privileges
from blockstack_deploy.paths import VENV_BIN
from blockstack_deploy.stack import EBPF_CONFIG_DIR, EBPF_EXPORTER, REPO, Stack
from blockstack_exporter.collectors.ebpf import parse_status
from blockstack_testsupport import procs

VNG = os.path.join(REPO, ".venv", "bin", "vng")
AGENT = os.path.join(REPO, "lab", "blockstack_lab", "vm_agent.py")
VM_ROOT = "/var/tmp"  # the guests' directories: images, script, console log
PREFIX = "blockstack-vm-"
JOURNAL = "vm.json"
GUEST_ADDRESS = "10.0.2.15"  # QEMU user networking's first guest address
# The guest's own ports (only reachable through the host-forwarded ones)
AGENT_PORT = 7000
EXPORTER_PORTS = {"node": 9100, "blockstack": 9363, "ebpf": 9435}
GUEST_EXPORTERS = tuple(EXPORTER_PORTS)
NVME_SIZE = 2 << 30  # sparse
GUEST_LVM_DIR = "/tmp/lvm"  # the guest's LVM_SYSTEM_DIR (its lvm.conf), on the guest's tmpfs
DOCTOR = os.path.join(VENV_BIN, "blockstack-doctor")
# Modules the guest's udev would load for QEMU's q35 machine and `-cpu max` (SATA and CD-ROM,
# KVM, watchdog, SMBus, CPU crypto and frequency drivers) that no scenario uses: under TCG on a
# busy machine each modprobe took 10-40 s, and udev's coldplug held the boot for minutes. Kernel
# parameter modprobe.blacklist: kmod refuses them when loaded by alias (udev); an explicit
# `modprobe NAME` in the guest still loads one.
BLACKLIST = (
    "kvm",
    "kvm_amd",
    "kvm_intel",
    "iTCO_wdt",
    "iTCO_vendor_support",
    "i2c_i801",
    "i2c_smbus",
    "lpc_ich",
    "ahci",
    "libahci",
    "sr_mod",
    "cdrom",
    "sg",
    "pcspkr",
    "serio_raw",
    "joydev",
    "evdev",
    "psmouse",
    "bochs",
    "drm_vram_helper",
    "powernow_k8",
    "acpi_cpufreq",
    "intel_rapl_msr",
    "intel_rapl_common",
    "aesni_intel",
    "ghash_clmulni_intel",
    "crc32_pclmul",
    "polyval_clmulni",
    "sha512_ssse3",
    "sha256_ssse3",
    "sha1_ssse3",
    "button",
    "qemu_fw_cfg",
)
# Kernels by the name the tests use: the newest installed of each line. 6.1 and 6.12 are Debian 12's
# packages; 5.10 (Debian 11) and sid are unpacked from bullseye's and sid's by scripts/fetch-kernel.sh
KERNEL_GLOBS = {
    "6.1": "/boot/vmlinuz-6.1.0-*-amd64",
    "6.12": "/boot/vmlinuz-6.12.*+deb12-amd64",
    "5.10": "/boot/vmlinuz-5.10.0-*-amd64",
}
# Kernels by the file in which fetch-kernel.sh names the release it installed: sid's changes with each
# upload (e.g. 7.2.13+deb14-amd64), its "+debN" with each Debian release
KERNEL_MARKERS = {"sid": "/var/lib/blockstack-lab/kernels/sid"}
KERNELS = ("6.1", "6.12", "5.10", "sid")
LVM_CONF = """\
# The VM lab's LVM configuration (vm.py): no udev in the guest, nothing written to /etc/lvm
devices {
    obtain_device_list_from_udev = 0
    external_device_info_source = "none"
}
activation {
    udev_sync = 0
    udev_rules = 0
    monitoring = 0
}
backup {
    backup = 0
    archive = 0
}
global {
    use_lvmetad = 0
}
"""


def kernel(name):
    """'/boot/vmlinuz-...' of a kernel by name (one of KERNELS, or a path); FileNotFoundError naming
    the make target that installs it."""
    if name.startswith("/"):
        return name
    if name in KERNEL_MARKERS:
        with contextlib.suppress(OSError):
            with open(KERNEL_MARKERS[name]) as f:
                path = "/boot/vmlinuz-" + (f.read().split() or [""])[0]
            if os.path.isfile(path):
                return path
        raise FileNotFoundError(
            f"no Debian {name} kernel (named in {KERNEL_MARKERS[name]}): run make vm-deps"
        )
    found = sorted(glob.glob(KERNEL_GLOBS[name]), key=_version_key)
    if not found:
        raise FileNotFoundError(f"no Debian {name} kernel ({KERNEL_GLOBS[name]}): run make vm-deps")
    return found[-1]


def distribution_paranoid(vmlinuz):
    """kernel.perf_event_paranoid as the distribution ships the kernel `vmlinuz`: 3 where its
    config has CONFIG_SECURITY_PERF_EVENTS_RESTRICT (Debian's and Ubuntu's patch "security,perf:
    Allow further restriction of perf_event_open": perf_event_open refused without CAP_SYS_ADMIN),
    else upstream's 2 (kernel/events/core.c); None without the config file beside it."""
    config = os.path.join(
        os.path.dirname(vmlinuz), "config-" + os.path.basename(vmlinuz).removeprefix("vmlinuz-")
    )
    try:
        with open(config) as f:
            return 3 if "CONFIG_SECURITY_PERF_EVENTS_RESTRICT=y" in f.read().split("\n") else 2
    except OSError:
        return None


def _version_key(path):
    return [int(n) for n in re.findall(r"\d+", os.path.basename(path))]


def missing(kernels=KERNELS):
    """What the VM lab needs and cannot find here, each naming the make target that provides it."""
    problems = [] if os.geteuid() == 0 else ["needs root (QEMU's 9p view of the host's root)"]
    if not os.access(VNG, os.X_OK):
        problems.append(f"{VNG} is missing (run make venv: virtme-ng from PyPI)")
    for tool in ("qemu-system-x86_64", "busybox", "lvm"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            problems.append(f"{tool} is not installed (run make vm-deps)")
    for k in kernels:
        try:
            kernel(k)
        except FileNotFoundError as e:
            problems.append(str(e))
    return problems


def ready(kernels):
    """For the lab's commands: False, with what is missing on stderr, if the VM lab cannot run
    here; else True, the guests of dead processes swept first (sweep_stale)."""
    problems = missing(kernels)
    if problems:
        print("the VM lab needs: " + "; ".join(problems), file=sys.stderr)
        return False
    sweep_stale()
    return True


def say(msg):
    """The lab commands' progress lines, timestamped."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclasses.dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


class GuestError(RuntimeError):
    pass


class Background:
    """A command running in the guest (Guest.background)."""

    def __init__(self, guest, ident, argv):
        self.guest, self.id, self.argv = guest, ident, argv

    def poll(self):
        """(exit status or None while it runs, its output so far: the last MiB)."""
        a = self.guest.request("poll", id=self.id)
        return a["rc"], a["output"]

    def stop(self):
        a = self.guest.request("stop", id=self.id)
        return a["rc"], a["output"]

    def wait(self, timeout):
        """(exit status, output) once it ends, within `timeout` seconds; stopped if it is not done."""

        def finished():
            rc, output = self.poll()
            return (rc, output) if rc is not None else None

        try:
            return procs.wait_until(f"{self.argv} in the guest", finished, timeout)
        finally:
            self.stop()


class AgentGuest:
    """The host's side of the guest's agent (vm_agent.py), shared by the lab's guests (Guest here,
    debian_host.DebianHost): requests, commands run and started, the console. A subclass sets
    self.ports["agent"] (the host-forwarded port), self.token, self.dir (console.log in it) and
    self.boot_timeout."""

    @property
    def console_log(self):
        return os.path.join(self.dir, "console.log")

    def console_tail(self, lines=40):
        """The console's last `lines`, after its lines where systemd said a unit failed or timed
        out: a guest in emergency mode has printed a screenful since (seen once, 2026-11-29: the
        Debian host after its reboot, cause not on the tail)."""
        with open(self.console_log, errors="replace") as f:
            text = f.readlines()
        failed = [line for line in text if re.search(r"FAILED|Dependency failed|Timed out", line)]
        return "".join(failed[-20:] + (["...\n"] if failed else []) + text[-lines:])

    def _wait_for_agent(self, proc, deadline, exited):
        """Until the agent answers (before `deadline`, a monotonic time): GuestError naming `exited`
        (e.g. "virtme-ng") if `proc` ends first, or with the console's tail at the deadline."""
        last = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise GuestError(
                    f"{exited} exited with {proc.returncode} during the boot:\n{self.console_tail()}"
                )
            try:
                return self.request("run", argv=["true"], timeout=30, connect_timeout=5)
            except (OSError, ValueError, GuestError) as e:
                last = e
                time.sleep(1)
        raise GuestError(
            f"the guest's agent did not answer within {self.boot_timeout} s ({last}):\n"
            f"{self.console_tail()}"
        )

    def _boot_retrying(self):
        """_boot(), and once more with other ports if a port picked free was taken before QEMU
        bound it (other tests pick ports too)."""
        try:
            self._boot()
        except GuestError as e:
            if "Could not set up host forwarding rule" not in str(e):
                raise
            self.say(
                f"{self.NAME}: a forwarded port was taken meanwhile; booting again with other ports: {e}"
            )
            self._stop_qemu()
            self.ports = {name: procs.free_port() for name in self.ports}
            self._save()
            self._boot()

    def __exit__(self, exc_type, exc, tb):
        # QEMU ended on its own (the guest's kernel panicked, or QEMU was killed): its exit status
        # and the kernel's last words, which close() keeps
        died = None
        if exc_type is not None and self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):  # it may be exiting just now
                died = self.proc.wait(2)
        self.close()
        if exc_type is not None and died is not None:
            tail = "".join(self.console.splitlines(keepends=True)[-60:])
            self.say(
                f"{self.NAME}: QEMU had exited by itself ({died}); the console's last lines:\n{tail}"
            )

    NAME = "vm"  # say()'s prefix
    POWEROFF_WAIT = 30  # seconds QEMU gets to exit once asked to power off

    def _ask_poweroff(self):
        self.request("shutdown", timeout=30, connect_timeout=5)

    def close(self):
        """Power off (asked through the agent), kill what is left of QEMU's process group, remove
        the directory (images included). Safe to call twice."""
        self._stop_qemu()
        if self._console:
            self._console.close()
            self._console = None
        if self.dir:
            with contextlib.suppress(OSError):
                self.console = self.console_tail(10**6)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.say(f"{self.NAME}: {self.release} powered off, {self.dir} removed")
            self.dir = None

    def _stop_qemu(self):
        if self.proc is not None:
            if (
                self.proc.poll() is None and self.boot_seconds is not None
            ):  # else no agent to ask: killed
                with contextlib.suppress(OSError, ValueError, GuestError):
                    self._ask_poweroff()
                try:
                    self.proc.wait(self.POWEROFF_WAIT)
                except subprocess.TimeoutExpired:
                    pass
            _kill_group(self.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            self.proc = None

    # -- commands in the guest -------------------------------------------------------------

    def request(self, op, connect_timeout=10, timeout=600, **fields):
        """One request to the guest's agent; its answer (raises GuestError on an error answer)."""
        with socket.create_connection(
            ("127.0.0.1", self.ports["agent"]), timeout=connect_timeout
        ) as s:
            s.settimeout(timeout + 30)
            s.sendall(
                json.dumps({"token": self.token, "op": op, "timeout": timeout, **fields}).encode()
                + b"\n"
            )
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        answer = json.loads(data)  # ValueError on an empty answer (the guest is not up yet)
        if "error" in answer and op != "run":
            raise GuestError(f"{op}: {answer['error']}")
        return answer

    def run(self, cmd, timeout=600, check=True):
        """Run cmd (argv list, or a string for sh -c) in the guest as root and wait; Result. With
        check, raises GuestError on a non-zero exit or a timeout."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        a = self.request("run", argv=argv, timeout=timeout)
        result = Result(a.get("rc"), a.get("stdout", ""), a.get("stderr", ""))
        if check and (result.rc != 0 or "error" in a):
            raise GuestError(
                f"{cmd!r} in the guest: {a.get('error') or f'exit {result.rc}'}\n"
                f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
            )
        return result

    def start(self, cmd):
        """Start cmd in the background in the guest; a Background."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return Background(self, self.request("start", argv=argv)["id"], argv)

    @contextlib.contextmanager
    def background(self, cmd):
        """cmd running in the guest for the body (Guest.start), stopped on exit."""
        job = self.start(cmd)
        try:
            yield job
        finally:
            with contextlib.suppress(OSError, ValueError, GuestError):
                job.stop()


class Guest(AgentGuest):
    """One booted guest: kernel `kernel` (one of KERNELS or a vmlinuz path) with `nvme` emulated NVMe
    devices of `nvme_size` bytes each on fresh images, `memory` and `cpus`, the exporters' ports
    forwarded. `boot_timeout` bounds the boot (the agent answering: ~1 min on a quiet machine, up
    to 5 on a loaded one); `qemu_opts` are appended to QEMU's command line (e.g. other device
    layouts: nvme-subsys for multipath); `blacklist`: modules udev must not load (BLACKLIST). A context manager:
    booted on enter, powered off and removed on exit, also on failure."""

    def __init__(
        self,
        kernel="6.1",
        nvme=1,
        nvme_size=NVME_SIZE,
        memory="2G",
        cpus=2,
        boot_timeout=600,
        qemu_opts=(),
        blacklist=BLACKLIST,
        say=print,
        root=VM_ROOT,
    ):
        self.kernel_name, self.vmlinuz = kernel, globals()["kernel"](kernel)
        self.release = os.path.basename(self.vmlinuz).removeprefix("vmlinuz-")
        self.nvme, self.nvme_size, self.memory, self.cpus = nvme, nvme_size, memory, cpus
        self.perf_event_paranoid = distribution_paranoid(self.vmlinuz)  # set at boot
        self.boot_timeout, self.extra_qemu_opts, self.say, self.root = (
            boot_timeout,
            list(qemu_opts),
            say,
            root,
        )
        self.blacklist = list(blacklist)
        self.dir = self.proc = self.token = None
        self._probe = self._ebpf_configs = None  # select-configs.sh in the guest, its answer
        self.ports = {}  # name -> host port forwarded to the guest ("agent", "node", ...)
        self.images = []  # the NVMe devices' image files, nvme0n1 first
        self.boot_seconds = None
        self._console = None
        self.console = ""  # the console's text, kept after close()

    # -- boot and teardown --------------------------------------------------------------

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix=PREFIX, dir=self.root)
        try:
            self._prepare()
            self._boot_retrying()
        except BaseException:
            self.close()
            raise
        return self

    def _prepare(self):
        self.token = secrets.token_hex(16)
        _write(os.path.join(self.dir, "token"), self.token + "\n", 0o600)
        _write(os.path.join(self.dir, "lvm.conf"), LVM_CONF)
        _write(os.path.join(self.dir, "guest.sh"), self._guest_script(), 0o755)
        for i in range(self.nvme):
            path = os.path.join(self.dir, f"nvme{i}.img")
            with open(path, "wb") as f:
                f.truncate(self.nvme_size)
            self.images.append(path)
        for name in ("agent", *GUEST_EXPORTERS):
            self.ports[name] = procs.free_port()
        self._save()

    def _guest_script(self):
        d = self.dir
        paranoid = (
            f"echo {self.perf_event_paranoid} > /proc/sys/kernel/perf_event_paranoid"
            if self.perf_event_paranoid is not None
            else ""
        )
        return f"""#!/bin/sh
# the VM lab's guest (blockstack_lab/vm.py): kernel.perf_event_paranoid as the distribution sets
# it, the service users, network, an lvm.conf without udev, then the agent
echo "blockstack-vm: $(uname -r) up after $(cut -d' ' -f1 /proc/uptime) s"
echo "blockstack-vm: kernel.perf_event_paranoid $(cat /proc/sys/kernel/perf_event_paranoid) at boot"
{paranoid}
# virtme-ng binds a made-up /etc/shadow over the host's; useradd renames its new one over it,
# which a mount point refuses (EBUSY): the overlay's own instead, copied up on write
umount /etc/shadow 2>/dev/null
{VENV_BIN}/python -c 'from blockstack_deploy import privileges; privileges.ensure_users()' ||
  echo "blockstack-vm: the service users could not be made: ebpf_exporter will not start"
ip link set lo up
nic=$(ls /sys/class/net | grep -v '^lo$' | head -1)
ip addr add {GUEST_ADDRESS}/24 dev "$nic" && ip link set "$nic" up
modprobe nvme 2>/dev/null
mkdir -p {GUEST_LVM_DIR} && cp {d}/lvm.conf {GUEST_LVM_DIR}/lvm.conf
export LVM_SYSTEM_DIR={GUEST_LVM_DIR}
exec /usr/bin/python3 {AGENT} --listen {GUEST_ADDRESS}:{AGENT_PORT} --token-file {d}/token
"""

    def qemu_opts(self):
        forwards = [f"hostfwd=tcp:127.0.0.1:{self.ports['agent']}-{GUEST_ADDRESS}:{AGENT_PORT}"]
        forwards += [
            f"hostfwd=tcp:127.0.0.1:{self.ports[n]}-{GUEST_ADDRESS}:{p}"
            for n, p in EXPORTER_PORTS.items()
        ]
        opts = [
            "-netdev",
            "user,id=lab,restrict=on," + ",".join(forwards),
            "-device",
            "virtio-net-pci,netdev=lab",
        ]
        for i, img in enumerate(self.images):
            opts += [
                "-drive",
                f"file={img},if=none,id=nv{i},format=raw,cache=none",
                "-device",
                f"nvme,drive=nv{i},serial=nvme{i}",
            ]
        return opts + self.extra_qemu_opts

    def command(self):
        """vng's command line: the kernel, TCG, memory and CPUs, the start script, QEMU's extras."""
        return [
            VNG,
            "--run",
            self.vmlinuz,
            "--disable-kvm",
            "--disable-microvm",
            "--memory",
            self.memory,
            "--cpus",
            str(self.cpus),
            "--verbose",
            f"--rwdir={self.dir}",
            *(
                [f"--append=modprobe.blacklist={','.join(self.blacklist)}"]
                if self.blacklist
                else []
            ),
            "--exec",
            f"sh {self.dir}/guest.sh",
            "--qemu-opts=" + " ".join(self.qemu_opts()),
        ]

    def _boot(self):
        self.say(f"vm: booting {self.release} (TCG, {self.nvme} NVMe, {self.memory}) in {self.dir}")
        start = time.monotonic()
        if self._console:
            self._console.close()
        self._console = open(self.console_log, "ab")
        self.proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.dir,
            # vng runs virtme-run from PATH: the one beside it in .venv
            env=dict(os.environ, PATH=os.path.dirname(VNG) + ":" + os.environ["PATH"]),
        )
        self._save()
        self._wait_for_agent(self.proc, start + self.boot_timeout, "virtme-ng")
        self.boot_seconds = time.monotonic() - start
        booted = re.search(r"kernel.perf_event_paranoid (\d+) at boot", self.console_tail(10**6))
        self.say(
            f"vm: {self.release} up in {self.boot_seconds:.1f} s; agent on 127.0.0.1:{self.ports['agent']}; "
            f"kernel.perf_event_paranoid {booted[1] if booted else '?'} at boot, "
            f"{self.perf_event_paranoid} set (the distribution's)"
        )

    def _save(self):
        path = os.path.join(self.dir, JOURNAL)
        _write(path, json.dumps({"pid": os.getpid(), "vng": self.proc.pid if self.proc else None}))

    # -- commands in the guest -------------------------------------------------------------

    def write_sysfs(self, dev, attr, value):
        self.run(["sh", "-c", f"echo {value} > /sys/block/{dev}/{attr}"])

    def read_sysfs(self, dev, attr):
        return self.run(["cat", f"/sys/block/{dev}/{attr}"]).stdout.strip()

    def start_doctor(self, *args):
        """`blockstack-doctor --json` (the console script of this .venv) started in the guest, in
        the background, on its real devices with the guest's lvm.conf; doctor(job) collects it.
        A minute under TCG on a busy machine: a scenario starts it while it waits for something."""
        # dmsetup under TCG on a busy machine can outlast the default 10 s (see exporter_commands)
        argv = [
            DOCTOR,
            "--json",
            f"--path.lvmconf={GUEST_LVM_DIR}/lvm.conf",
            "--collector.dm.timeout=60",
            *([f"--collector.ebpf.status-file={self.ebpf_status_file}"] if self._probed() else []),
            *args,
        ]
        report = f"/tmp/blockstack-doctor-{secrets.token_hex(4)}.json"
        job = self.start(" ".join(shlex.quote(a) for a in argv) + f" > {report}")
        job.report = report
        return job

    def doctor(self, *args, job=None, timeout=300):
        """(exit status, report) of a blockstack-doctor run in the guest: `job` (start_doctor), or
        one run now with `args`. GuestError if it could not read what it needs (exit 2) or failed."""
        job = job or self.start_doctor(*args)
        rc, output = job.wait(timeout)
        if rc not in (0, 1):
            raise GuestError(f"blockstack-doctor in the guest: exit {rc}\n{output[-3000:]}")
        return rc, json.loads(self.run(["cat", job.report]).stdout)

    # -- the exporters in the guest ---------------------------------------------------------

    def probe_ebpf_configs(self):
        """Start ebpf-configs/select-configs.sh in the guest, in the background: each probe loads
        and verifies BPF programs, a minute or more under TCG on a busy machine. ebpf_configs()
        collects it; scenarios wait for it before their I/O (settle_ebpf_configs)."""
        if self._probe is None and self._ebpf_configs is None:
            # jbd2 is a module: the fexit variant attaches to its functions only once it is loaded
            # (a host with ext4 mounted has it; a guest before its first mount has not)
            # probed as ebpf_exporter runs (ebpf_identity), as stack.py probes them
            self._probe = self.start(
                f"modprobe ext4; SELECT_CONFIGS_TIMEOUT=300 "
                f"SELECT_CONFIGS_AS={shlex.quote(' '.join(self.ebpf_identity))} "
                f"{os.path.join(REPO, 'ebpf-configs', 'select-configs.sh')} {EBPF_EXPORTER} "
                f"{EBPF_CONFIG_DIR} {self.ebpf_status_file}"
            )

    def settle_ebpf_configs(self):
        """The probe (probe_ebpf_configs) run to its end before a scenario starts its I/O: each
        probe attaches BPF programs to the block tracepoints and detaches them, and the kernel
        patches a tracepoint's call sites on the first attach and the last detach. On sid's 7.2
        under TCG a vCPU running through a site while the other patches it took an unhandled
        int3 ("Oops: int3" at blk_mq_start_request+0x15, dm_submit_bio+0x5f3: the guest
        panics) in 3 of 3 runs of ten attach/detach cycles beside dd through a dm snapshot;
        6.12 went through ten cycles clean. So the sites are patched while no I/O runs; then
        ebpf_exporter attaches before the reads start and detaches after they stop."""
        self.ebpf_configs()

    @property
    def ebpf_identity(self):
        """The setpriv prefix that gives ebpf_exporter in the guest its production user and the
        capabilities it has on the guest's kernel (privileges.wrap: CAP_BPF and CAP_PERFMON, and
        CAP_SYS_RESOURCE before 5.11); its user is made at boot (_guest_script)."""
        return privileges.wrap("ebpf", [], release=self.release)

    @property
    def ebpf_status_file(self):
        """select-configs.sh's status of each set in the guest (its directory is shared with the
        host read-write): blockstack-exporter and the doctor in the guest read it."""
        return os.path.join(self.dir, "ebpf-status.tsv")

    def ebpf_configs(self, timeout=1200):
        """The ebpf_exporter configs the guest's kernel loads, comma-separated ("" if none:
        ebpf_exporter is then not started), from ebpf-configs/select-configs.sh run there (docs/kernels.md's kernel
        table)."""
        if self._ebpf_configs is None:
            self.probe_ebpf_configs()
            rc, output = self._probe.wait(timeout)
            if rc != 0 or not os.path.exists(self.ebpf_status_file):
                raise GuestError(f"select-configs.sh failed in the guest (exit {rc}): {output}")
            # its warnings (stderr) first, the configs (stdout) on the last line, empty if none
            lines = [line for line in output.splitlines() if line.strip()]
            warnings = [line for line in lines if line.startswith("select-configs:")]
            if warnings:
                self.say("vm: select-configs.sh in the guest: " + " ".join(warnings))
            self._ebpf_configs = (
                lines[-1].strip() if lines and not lines[-1].startswith("select-configs:") else ""
            )
            self.say(
                f"vm: ebpf_exporter configs that load on {self.release}: {self._ebpf_configs or 'none'}"
            )
        return self._ebpf_configs

    def _probed(self):
        """Whether select-configs.sh ran (or runs) in the guest; waits for its answer."""
        if self._probe is None and self._ebpf_configs is None:
            return False
        self.ebpf_configs()
        return True

    def ebpf_status(self):
        """{set: (config or "", {variant: error})} of select-configs.sh's run in the guest."""
        self.ebpf_configs()
        with open(self.ebpf_status_file) as f:
            return {name: (chosen, errors) for name, chosen, errors in parse_status(f.read())}

    def exporter_commands(self, ebpf_configs=None):
        """{component: argv} of the stack's exporters (Stack.commands: the same flags as `make up`),
        listening on the guest's address instead of 127.0.0.1."""
        stack = Stack(
            os.path.join(self.dir, "guest-stack"),
            components=GUEST_EXPORTERS,
            ports=EXPORTER_PORTS,
            ebpf_configs=self.ebpf_configs() if ebpf_configs is None else ebpf_configs,
        )
        stack.ebpf_status_file, stack.kernel_release = self.ebpf_status_file, self.release
        listen = "--web.listen-address=127.0.0.1:"
        commands = {
            c: [a.replace(listen, f"--web.listen-address={GUEST_ADDRESS}:") for a in argv]
            for c, (argv, _, _) in stack.commands().items()
        }
        # dmsetup under TCG on a busy machine outlasted the default 5 s: the dm collector then
        # reported no snapshot status (COW use) on 6.12
        commands["blockstack"].append("--collector.dm.timeout=30")
        return commands

    @contextlib.contextmanager
    def exporters(self, timeout=300, ebpf_configs=None):
        """node_exporter, blockstack-exporter and ebpf_exporter running in the guest for the body,
        each answering on its host-forwarded port; yields {component: host port}. ebpf_exporter
        runs under its production identity (ebpf_identity), the others as root. Their output is
        in guest.exporter_logs() while they run."""
        with contextlib.ExitStack() as es:
            self._exporters = {}
            for c, argv in self.exporter_commands(ebpf_configs).items():
                job = es.enter_context(
                    self.background(
                        ["env", "OTEL_TRACES_EXPORTER=none", *self.ebpf_identity, *argv]
                        if c == "ebpf"
                        else argv
                    )
                )
                self._exporters[c] = job
            for c, job in self._exporters.items():
                url = f"http://127.0.0.1:{self.ports[c]}/metrics"

                def up():
                    rc, out = job.poll()
                    if rc is not None:
                        raise GuestError(
                            f"{c} exporter exited with {rc} in the guest:\n{out[-3000:]}"
                        )
                    try:
                        procs.http_get(url, timeout=20)
                        return True
                    except OSError:
                        return False

                procs.wait_until(f"the guest's {c} exporter on {url}", up, timeout, interval=2)
            self.say(
                "vm: exporters up in the guest: "
                + ", ".join(f"{c} on 127.0.0.1:{self.ports[c]}" for c in self._exporters)
            )
            yield {c: self.ports[c] for c in self._exporters}

    def exporter_logs(self):
        return {c: job.poll()[1] for c, job in getattr(self, "_exporters", {}).items()}


class HostStack(Stack):
    """The stack's servers on the host — Prometheus with the project's rules, Alertmanager, the
    page receiver (and Grafana if listed) — scraping a guest's exporters through their
    host-forwarded ports. Only the servers run here (`commands`)."""

    def __init__(
        self, guest, workdir, servers=("receiver", "alertmanager", "prometheus"), host=None, **kw
    ):
        ports = {c: guest.ports[c] for c in GUEST_EXPORTERS}
        kw.setdefault("ebpf_configs", guest.ebpf_configs())  # the guest's kernel's, not this host's
        super().__init__(
            workdir,
            host=host or f"vm-{guest.kernel_name}",
            components=[*GUEST_EXPORTERS, *servers],
            ports=ports,
            **kw,
        )

    def commands(self):
        return {c: cmd for c, cmd in super().commands().items() if c not in GUEST_EXPORTERS}


class Phases(dict):
    """Seconds per phase of a scenario, in order: end(name) closes the phase that began at the
    previous end (or at creation)."""

    def __init__(self):
        super().__init__()
        self._since = time.monotonic()

    def end(self, name):
        now = time.monotonic()
        self[name] = round(now - self._since, 1)
        self._since = now


def _write(path, text, mode=0o644):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _kill_group(pid):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        time.sleep(1)


def sweep_stale(say=print, root=VM_ROOT):
    """Power off and remove the guests whose owning process is gone (SIGKILL): kill their QEMU's
    process group, remove their directory. Guests of running processes are left alone."""
    swept = []
    for d in sorted(glob.glob(os.path.join(root, PREFIX + "*"))):
        try:
            with open(os.path.join(d, JOURNAL)) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            continue
        try:
            os.kill(saved["pid"], 0)
            continue
        except ProcessLookupError:
            pass
        group = saved.get("vng") or saved.get("qemu")  # Guest's virtme-ng, DebianHost's QEMU
        if group:
            say(f"sweep: stopping the guest of dead process {saved['pid']} (process group {group})")
            _kill_group(group)
        shutil.rmtree(d, ignore_errors=True)
        swept.append(d)
    return swept
