"""A real Debian 12 host in the VM lab: systemd as PID 1, udev, LVM with its own lvm.conf, apt and
dpkg, booted by QEMU (TCG) from a disk image built from Debian's packages. Where vm.Guest runs the
host's binaries over virtme-ng's read-only view of the host's root (fast to boot, but no init, no
udev, no package manager), a DebianHost is what the project's .deb and systemd units meet on a
user's machine. The same agent (vm_agent.py) runs the commands, so the API is Guest's:

    repo = build_repo()                               # Debian's .debs for the guest, with their dependencies
    with DebianHost("6.1", nvme=1, repo=repo) as h:   # boots from a copy-on-write overlay; removed on exit
        h.run("apt-get install -y prometheus-node-exporter")   # from the local repo, no network
        h.copy_in("blockstack.deb", "/root/")          # then h.run("apt-get install -y /root/blockstack.deb")
        h.reboot()                                     # systemctl reboot, back when the agent answers
        h.ports["node"]                                # host port on 127.0.0.1 forwarded to the guest's 9100

How it is made:
- The image (build_image, `make debian-image`): `mmdebstrap --variant=minbase` of bookworm with
  PACKAGES from the host's own Debian mirror (read from /etc/apt, never changed), the kernel's
  modules copied from the host's /lib/modules/RELEASE (nvme, dm-snapshot, 9p load from the image),
  the lab's configuration (CONFIG_FILES: network, fstab with the 9p shares, the agent's unit, apt
  pointed at the local repo only), then `mkfs.ext4 -d` into a sparse raw image, cached under
  .build/debian/ by a key of everything that goes into it (IMAGE_VERSION, the packages, the kernel
  release, the configuration): built once (25-30 s here, mmdebstrap 21 s of it), then reused.
  Beside it the image's dpkg status (build_repo resolves against it) and its package list.
- Each DebianHost has its own directory in /var/tmp (blockstack-vm-*, swept like a Guest's by
  vm.sweep_stale): a qcow2 overlay on the cached image, fresh sparse NVMe images, the console log,
  and the 9p share `lab` (read-only, /mnt/lab in the guest: the token, vm_agent.py, the files of
  copy_in). QEMU boots Debian's kernel and initrd from /boot (root=/dev/vda); systemd starts
  systemd-networkd (eth0 at 10.0.2.15, QEMU user networking, restricted: no way out of the guest)
  and blockstack-lab-agent.service, the agent on 10.0.2.15:7000. Host ports on 127.0.0.1 only are
  forwarded to the agent and to each of `ports` (PORTS: the stack's).
- The local repo (build_repo): the packages the guest installs and their dependencies not already in
  the image, downloaded by apt with a private configuration (the host's mirror, lists, cache and
  the image's dpkg status in .build/debian/apt; the host's installed state is never read or
  touched), indexed by dpkg-scanpackages as a flat repo, shared read-only as /mnt/repo: the guest's
  only apt source is `deb [trusted=yes] file:/mnt/repo ./`, its lists read once after the first
  boot. Without a repo the share is an empty one. Recommends are not installed (as in build_repo's
  closure).
- Kernels: those with an initrd in /boot (Debian 12's 6.1 and 6.12: the root disk's virtio_blk is
  a module); the image's ext4 needs 5.15 or newer (orphan_file).
"""

import argparse
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from blockstack_deploy.stack import REPO
from blockstack_lab import vm
from blockstack_lab.vm import AGENT_PORT, GUEST_ADDRESS, AgentGuest, GuestError, _kill_group, _write
from blockstack_testsupport import procs

SUITE = "bookworm"
# Bump when the image changes in a way the key below does not see (the build steps)
IMAGE_VERSION = 1
CACHE = os.path.join(REPO, ".build", "debian")
IMAGE_SIZE = 6 << 30  # sparse; the root filesystem's size in the guest
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# In the image beside systemd and udev: the device stack (LVM, thin pools, ext4), fio, python3 (the
# agent, blockstack-exporter), curl; dbus for systemd-logind and hostnamectl like a real host
PACKAGES = (
    "systemd-sysv",
    "udev",
    "dbus",
    "kmod",
    "iproute2",
    "procps",
    "lvm2",
    "thin-provisioning-tools",
    "e2fsprogs",
    "fio",
    "python3",
    "curl",
)
# What build_repo downloads by default: the stack's Debian packages and the project's .deb's Python dependencies
REPO_PACKAGES = (
    "prometheus-node-exporter",
    "prometheus",
    "prometheus-alertmanager",
    "python3-prometheus-client",
    "python3-yaml",
    "python3-bcrypt",
)
# The guest's ports forwarded to 127.0.0.1 (deploy/blockstack_deploy/roles/'s)
PORTS = {
    "node": 9100,
    "blockstack": 9363,
    "ebpf": 9435,
    "prometheus": 9090,
    "alertmanager": 9093,
    "receiver": 9466,
    "grafana": 3000,
}
SHARE = "/mnt/lab"  # the guest's view of the host's <dir>/lab (read-only)
GUEST_REPO = "/mnt/repo"  # the guest's view of the local apt repo (read-only)
# The shares are the lab's, not the host's: `nofail` keeps them out of local-fs.target, whose
# failure is emergency mode, and the mount may take 5 min instead of systemd's 90 s. A fresh CI
# run (2026-11-29, a saturated machine) once met the guest in emergency mode after its reboot,
# right after network-online.target, with no failure on the console's tail: local-fs.target
# still waiting then failing, as a share mount past 90 s makes it (not reproduced in 6 reboots
# beside a CPU hog). Now a share that does not mount fails the agent's unit
# (RequiresMountsFor), named on the console: "Failed to mount mnt-lab.mount".
NINE_P = "trans=virtio,version=9p2000.L,msize=524288,ro,nofail,x-systemd.mount-timeout=300"
AGENT_UNIT = "blockstack-lab-agent.service"
# The lab's configuration of the image: path -> content
CONFIG_FILES = {
    "etc/hostname": "blockstack-debian\n",
    "etc/hosts": "127.0.0.1\tlocalhost\n127.0.1.1\tblockstack-debian\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "etc/fstab": f"""\
# the VM lab's Debian host (blockstack_lab/debian_host.py): the root is /dev/vda (kernel command
# line); the host's shares over 9p, read-only
/dev/vda / ext4 rw,errors=remount-ro 0 1
lab {SHARE} 9p {NINE_P} 0 0
repo {GUEST_REPO} 9p {NINE_P} 0 0
""",
    # QEMU user networking: the guest at 10.0.2.15, the host's side at 10.0.2.2 (restricted: no route out)
    "etc/systemd/network/10-lab.network": f"""\
[Match]
Name=eth0

[Network]
Address={GUEST_ADDRESS}/24
LinkLocalAddressing=no
IPv6AcceptRA=no
""",
    f"etc/systemd/system/{AGENT_UNIT}": f"""\
[Unit]
Description=The VM lab's command agent (blockstack_lab/vm_agent.py) on {GUEST_ADDRESS}:{AGENT_PORT}
RequiresMountsFor={SHARE}
Wants=network-online.target
After=network-online.target

[Service]
Environment=DEBIAN_FRONTEND=noninteractive
ExecStart=/usr/bin/python3 {SHARE}/vm_agent.py --listen {GUEST_ADDRESS}:{AGENT_PORT} --token-file {SHARE}/token
Restart=on-failure
RestartSec=1

[Install]
WantedBy=multi-user.target
""",
    # the local repo is the only source: the guest has no way out
    "etc/apt/sources.list": f"deb [trusted=yes] file:{GUEST_REPO} ./\n",
    "etc/apt/apt.conf.d/90blockstack-lab": 'APT::Install-Recommends "false";\nAcquire::Languages "none";\n',
}
ENABLE = ("systemd-networkd.service", AGENT_UNIT)
MASK = ("apt-daily.timer", "apt-daily-upgrade.timer")  # nothing to fetch from


def initrd(vmlinuz):
    """Debian's initrd beside a /boot/vmlinuz-RELEASE; FileNotFoundError if there is none."""
    path = vmlinuz.replace("vmlinuz-", "initrd.img-")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"no initrd {path} for {vmlinuz}: the Debian host boots kernels installed "
            f"by apt (6.1, 6.12; make vm-deps)"
        )
    return path


def missing(kernel="6.1"):
    """What a DebianHost needs and cannot find here, each naming the make target that provides it."""
    problems = [] if os.geteuid() == 0 else ["needs root (mmdebstrap, the image's files)"]
    for tool in ("qemu-system-x86_64", "qemu-img", "mmdebstrap", "mkfs.ext4", "dpkg-scanpackages"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            problems.append(f"{tool} is not installed (run make vm-deps)")
    try:
        initrd(vm.kernel(kernel))
    except FileNotFoundError as e:
        problems.append(str(e))
    return problems


# -- the host's Debian mirror -------------------------------------------------------------------


def host_uri(suite):
    """The URI of the host's apt source (one-line or deb822) that serves `suite`, or None."""
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        with contextlib.suppress(OSError), open(path) as f:
            for line in f:
                words = re.sub(r"\[[^]]*\]", "", line.split("#")[0]).split()
                if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                    return words[1]
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        with contextlib.suppress(OSError), open(path) as f:
            stanzas = f.read().split("\n\n")
        for stanza in stanzas:
            fields = {}
            for line in stanza.splitlines():
                if line.strip().startswith("#") or ":" not in line:
                    continue
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.split()
            if (
                fields.get("enabled", ["yes"])[0].lower() != "no"
                and "deb" in fields.get("types", [])
                and suite in fields.get("suites", [])
                and fields.get("uris")
            ):
                return fields["uris"][0]
    return None


def sources(suite=SUITE):
    """One-line apt sources of `suite`, -updates and -security on the host's own mirrors, checked
    against Debian's archive keyring."""
    main, security = host_uri(suite), host_uri(f"{suite}-security")
    if not main:
        raise RuntimeError(
            f"no apt source of the host serves {suite}: cannot tell its Debian mirror"
        )
    lines = [f"deb [signed-by={KEYRING}] {main} {suite} main"]
    if host_uri(f"{suite}-updates"):
        lines.append(
            f"deb [signed-by={KEYRING}] {host_uri(suite + '-updates')} {suite}-updates main"
        )
    if security:
        lines.append(f"deb [signed-by={KEYRING}] {security} {suite}-security main")
    return lines


# -- the image ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(name):
    """An exclusive lock on CACHE/name: one build at a time (other processes wait)."""
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, name), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def image_key(release, packages=PACKAGES):
    facts = {
        "version": IMAGE_VERSION,
        "suite": SUITE,
        "packages": sorted(packages),
        "release": release,
        "size": IMAGE_SIZE,
        "config": CONFIG_FILES,
        "enable": ENABLE,
        "mask": MASK,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


class Image:
    """A cached base image's files: the raw ext4 image, its dpkg status, its package list."""

    def __init__(self, release, packages=PACKAGES):
        self.release, self.packages = release, tuple(packages)
        self.key = image_key(release, packages)
        stem = os.path.join(CACHE, f"{SUITE}-{self.key}")
        self.path, self.status, self.manifest = stem + ".img", stem + ".status", stem + ".json"

    def exists(self):
        return all(os.path.exists(p) for p in (self.path, self.status, self.manifest))


def build_image(kernel="6.1", packages=PACKAGES, say=print):
    """The base image for `kernel` (one of vm.KERNELS or a vmlinuz path): built if not cached.
    An Image; its manifest records the build's seconds and the packages' versions."""
    release = os.path.basename(vm.kernel(kernel)).removeprefix("vmlinuz-")
    image = Image(release, packages)
    if image.exists():
        return image
    with _locked("build.lock"):
        if image.exists():  # built by another process meanwhile
            return image
        modules = f"/lib/modules/{release}"
        if not os.path.isfile(os.path.join(modules, "modules.dep")):
            raise FileNotFoundError(f"no modules of {release} in {modules} (make vm-deps)")
        started = time.monotonic()
        stage = tempfile.mkdtemp(prefix="blockstack-debian-build-", dir=vm.VM_ROOT)
        try:
            root = os.path.join(stage, "root")
            say(
                f"debian: mmdebstrap {SUITE} ({len(packages)} packages) from the host's mirror into {root}"
            )
            subprocess.run(
                [
                    "mmdebstrap",
                    "--variant=minbase",
                    "--mode=root",
                    "--quiet",
                    "--include=" + ",".join(packages),
                    # no manuals, translations or docs in the lab's image (nor later installs)
                    "--dpkgopt=path-exclude=/usr/share/man/*",
                    "--dpkgopt=path-exclude=/usr/share/locale/*",
                    "--dpkgopt=path-include=/usr/share/locale/locale.alias",
                    "--dpkgopt=path-exclude=/usr/share/doc/*",
                    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
                    SUITE,
                    root,
                    *sources(),
                ],
                check=True,
                stdin=subprocess.DEVNULL,
            )
            debootstrapped = time.monotonic() - started
            _configure(root, modules, say)
            versions = subprocess.run(
                ["chroot", root, "dpkg-query", "-W", "-f", "${Package}\t${Version}\n"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            tmp = image.path + ".tmp"
            with open(tmp, "wb") as f:
                f.truncate(IMAGE_SIZE)
            say(f"debian: mkfs.ext4 -d into {image.path}")
            subprocess.run(
                ["mkfs.ext4", "-q", "-F", "-L", "blockstack-root", "-d", root, tmp], check=True
            )
            shutil.copyfile(os.path.join(root, "var/lib/dpkg/status"), image.status)
            seconds = round(time.monotonic() - started, 1)
            _write(
                image.manifest,
                json.dumps(
                    {
                        "suite": SUITE,
                        "release": release,
                        "key": image.key,
                        "packages": list(packages),
                        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "seconds": seconds,
                        "mmdebstrap_seconds": round(debootstrapped, 1),
                        "versions": dict(line.split("\t") for line in versions.splitlines()),
                    },
                    indent=1,
                )
                + "\n",
            )
            os.rename(tmp, image.path)
            say(
                f"debian: image {image.path} built in {seconds} s (mmdebstrap {debootstrapped:.0f} s)"
            )
        finally:
            shutil.rmtree(stage, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(image.path + ".tmp")
    return image


def _configure(root, modules, say):
    """The lab's configuration of a freshly bootstrapped root: CONFIG_FILES, the units enabled and
    masked, a machine id, the kernel's modules."""
    for path, text in CONFIG_FILES.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        _write(full, text)
    for d in (SHARE, GUEST_REPO):
        os.makedirs(root + d, exist_ok=True)
    subprocess.run(
        ["systemctl", f"--root={root}", "enable", *ENABLE], check=True, capture_output=True
    )
    subprocess.run(["systemctl", f"--root={root}", "mask", *MASK], check=True, capture_output=True)
    # a machine id of the image's own: no first-boot logic on each guest
    _write(os.path.join(root, "etc/machine-id"), secrets.token_hex(16) + "\n", 0o444)
    say(f"debian: copying {modules} into the image")
    shutil.copytree(modules, root + modules, symlinks=True)
    for link in ("build", "source"):  # links into the host's kernel headers
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(root + modules, link))
    subprocess.run(["depmod", "-b", root, os.path.basename(modules)], check=True)


# -- the local apt repository ------------------------------------------------------------------


def _lab_apt(d, status):
    """apt-get with the lab's private configuration in `d`, resolving against the dpkg `status`."""
    return [
        "apt-get",
        "-q",
        "-o",
        f"Dir::Etc::sourcelist={d}/sources.list",
        "-o",
        f"Dir::Etc::sourceparts={d}/empty",
        "-o",
        f"Dir::Etc::preferences={d}/preferences",
        "-o",
        f"Dir::Etc::preferencesparts={d}/empty",
        "-o",
        f"Dir::State={d}/state",
        "-o",
        f"Dir::State::status={status}",
        "-o",
        f"Dir::Cache={d}/cache",
        "-o",
        "Acquire::Languages=none",
        "-o",
        "APT::Install-Recommends=false",
        "-o",
        "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false",
    ]


def build_repo(packages=REPO_PACKAGES, kernel="6.1", image=None, say=print):
    """A flat apt repository (a directory: the .debs and Packages) of `packages` and their
    dependencies that `image` (build_image's for `kernel` by default) lacks, downloaded from the
    host's mirror with a private apt configuration; cached by the image and the package list.
    A package given as the path of a .deb brings its dependencies only (copy_in the .deb itself):
    build_repo((*REPO_PACKAGES, "dist/blockstack_1.0_all.deb")). Its path (DebianHost(repo=...))."""
    image = image or build_image(kernel, say=say)
    packages = [os.path.abspath(p) if p.endswith(".deb") else p for p in packages]
    facts = [image.key, sorted(packages)] + [
        _sha256(p) for p in sorted(packages) if p.endswith(".deb")
    ]
    key = hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]
    repo = os.path.join(CACHE, f"repo-{key}")
    if os.path.exists(os.path.join(repo, "Packages")):
        return repo
    with _locked("repo.lock"):
        if os.path.exists(os.path.join(repo, "Packages")):
            return repo
        started = time.monotonic()
        d = os.path.join(CACHE, "apt")
        shutil.rmtree(d, ignore_errors=True)
        for sub in ("empty", "state/lists/partial", "cache/archives/partial", "dpkg"):
            os.makedirs(os.path.join(d, sub))
        _write(os.path.join(d, "sources.list"), "\n".join(sources()) + "\n")
        _write(os.path.join(d, "preferences"), "")
        status = os.path.join(
            d, "dpkg", "status"
        )  # apt's locks land beside it, in the lab's directory
        shutil.copyfile(image.status, status)
        apt = _lab_apt(d, status)
        names = [os.path.basename(p) for p in packages]
        say(
            f"debian: downloading {' '.join(names)} and what {os.path.basename(image.path)} lacks of their dependencies"
        )
        subprocess.run([*apt, "update"], check=True, stdin=subprocess.DEVNULL, capture_output=True)
        subprocess.run(
            [*apt, "install", "--download-only", "-y", *packages],
            check=True,
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )
        tmp = repo + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for deb in glob.glob(os.path.join(d, "cache", "archives", "*.deb")):
            shutil.move(deb, tmp)
        index = subprocess.run(
            ["dpkg-scanpackages", "--multiversion", "."],
            cwd=tmp,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        _write(os.path.join(tmp, "Packages"), index)
        os.rename(tmp, repo)
        shutil.rmtree(d, ignore_errors=True)
        debs = len(glob.glob(os.path.join(repo, "*.deb")))
        size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(repo, "*.deb")))
        say(
            f"debian: repo {repo}: {debs} packages, {size >> 20} MiB, in {time.monotonic() - started:.0f} s"
        )
    return repo


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# -- the guest ---------------------------------------------------------------------------------


class DebianHost(AgentGuest):
    """One booted Debian 12 host: kernel `kernel` (one of vm.KERNELS with an initrd, or a vmlinuz
    path) with the image of build_image (built first if need be), `nvme` emulated NVMe devices of
    `nvme_size` bytes each on fresh images, `memory` and `cpus`, `ports` ({name: guest port})
    forwarded from 127.0.0.1 (self.ports[name]: the host's side), the apt repository `repo`
    (build_repo) as its only source. `boot_timeout` bounds each boot (the agent answering);
    `qemu_opts` are appended to QEMU's command line; `blacklist`: modules udev must not load
    (vm.BLACKLIST). A context manager: booted on enter, powered off and removed on exit, also on
    failure. run, start, background, request and console_tail are vm.Guest's."""

    def __init__(
        self,
        kernel="6.1",
        nvme=1,
        nvme_size=vm.NVME_SIZE,
        memory="2G",
        cpus=2,
        ports=None,
        repo=None,
        packages=PACKAGES,
        boot_timeout=600,
        qemu_opts=(),
        blacklist=vm.BLACKLIST,
        say=print,
        root=vm.VM_ROOT,
    ):
        self.kernel_name, self.vmlinuz = kernel, vm.kernel(kernel)
        self.initrd = initrd(self.vmlinuz)
        self.release = os.path.basename(self.vmlinuz).removeprefix("vmlinuz-")
        self.nvme, self.nvme_size, self.memory, self.cpus = nvme, nvme_size, memory, cpus
        self.guest_ports = dict(PORTS if ports is None else ports)
        self.repo, self.packages = repo, tuple(packages)
        self.boot_timeout, self.extra_qemu_opts, self.say, self.root = (
            boot_timeout,
            list(qemu_opts),
            say,
            root,
        )
        self.blacklist = list(blacklist)
        self.dir = self.proc = self.token = self.image = None
        self.ports = {}  # name -> host port on 127.0.0.1 ("agent", "node", ...)
        self.images = []  # the NVMe devices' image files, nvme0n1 first
        self.boot_seconds = None  # the first boot: QEMU started -> the agent answers
        self.reboot_seconds = []  # each reboot(): systemctl reboot -> the agent answers again
        self.power_cycle_seconds = []  # each power_cycle(): systemctl poweroff -> a new QEMU's agent answers
        self.apt_update_seconds = None  # the first boot's apt-get update of the local repo
        self._console = None
        self._copies = 0
        self.console = ""  # the console's text, kept after close()

    # -- boot and teardown --------------------------------------------------------------

    def __enter__(self):
        self.image = build_image(self.kernel_name, self.packages, say=self.say)
        self.dir = tempfile.mkdtemp(prefix=vm.PREFIX, dir=self.root)
        try:
            self._prepare()
            self._boot_retrying()
            # the local repo's lists, once (they stay in the overlay across reboots): apt-get
            # install of a name or of a .deb copied in resolves from the repo straight away
            start = time.monotonic()
            self.run("apt-get update -q", timeout=600)
            self.apt_update_seconds = time.monotonic() - start
        except BaseException:
            self.close()
            raise
        return self

    @property
    def share(self):
        """The host's side of the guest's /mnt/lab (read-only in the guest)."""
        return os.path.join(self.dir, "lab")

    def _prepare(self):
        os.makedirs(os.path.join(self.share, "in"))
        self.token = secrets.token_hex(16)
        _write(os.path.join(self.share, "token"), self.token + "\n", 0o600)
        shutil.copyfile(vm.AGENT, os.path.join(self.share, "vm_agent.py"))
        if self.repo is None:  # the guest's apt source must exist: an empty repo
            self.repo = os.path.join(self.dir, "repo")
            os.makedirs(self.repo)
            _write(os.path.join(self.repo, "Packages"), "")
        subprocess.run(
            [
                "qemu-img",
                "create",
                "-q",
                "-f",
                "qcow2",
                "-b",
                self.image.path,
                "-F",
                "raw",
                self.overlay,
            ],
            check=True,
        )
        for i in range(self.nvme):
            path = os.path.join(self.dir, f"nvme{i}.img")
            with open(path, "wb") as f:
                f.truncate(self.nvme_size)
            self.images.append(path)
        for name in ("agent", *self.guest_ports):
            self.ports[name] = procs.free_port()
        self._save()

    @property
    def overlay(self):
        return os.path.join(self.dir, "root.qcow2")

    def command(self):
        """QEMU's command line: Debian's kernel and initrd, TCG, the overlay as /dev/vda, the shares,
        the network with its forwarded ports, the NVMe devices, the console into console.log."""
        append = [
            "root=/dev/vda",
            "rw",
            "console=ttyS0",
            "net.ifnames=0",
            *([f"modprobe.blacklist={','.join(self.blacklist)}"] if self.blacklist else []),
        ]
        forwards = [f"hostfwd=tcp:127.0.0.1:{self.ports['agent']}-{GUEST_ADDRESS}:{AGENT_PORT}"]
        forwards += [
            f"hostfwd=tcp:127.0.0.1:{self.ports[n]}-{GUEST_ADDRESS}:{p}"
            for n, p in self.guest_ports.items()
        ]
        cmd = [
            "qemu-system-x86_64",
            "-name",
            "blockstack-debian",
            "-machine",
            "q35",
            "-accel",
            "tcg",
            "-cpu",
            "max",
            "-smp",
            str(self.cpus),
            "-m",
            self.memory,
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-kernel",
            self.vmlinuz,
            "-initrd",
            self.initrd,
            "-append",
            " ".join(append),
            "-chardev",
            f"file,id=console,path={self.console_log},append=on",
            "-serial",
            "chardev:console",
            # the overlay is thrown away on exit: no flush needs to reach the host's disk
            "-drive",
            f"file={self.overlay},if=virtio,format=qcow2,cache=unsafe,discard=unmap",
            "-netdev",
            "user,id=lab,restrict=on," + ",".join(forwards),
            "-device",
            "virtio-net-pci,netdev=lab",
            "-device",
            "virtio-rng-pci",
            "-virtfs",
            f"local,path={self.share},mount_tag=lab,security_model=none,readonly=on",
            "-virtfs",
            f"local,path={self.repo},mount_tag=repo,security_model=none,readonly=on",
        ]
        for i, img in enumerate(self.images):
            cmd += [
                "-drive",
                f"file={img},if=none,id=nv{i},format=raw,cache=none",
                "-device",
                f"nvme,drive=nv{i},serial=nvme{i}",
            ]
        return cmd + self.extra_qemu_opts

    def _boot(self):
        self.say(
            f"debian: booting {self.release} (TCG, {self.nvme} NVMe, {self.memory}) from "
            f"{os.path.basename(self.image.path)} in {self.dir}"
        )
        start = time.monotonic()
        if self._console:
            self._console.close()
        self._console = open(
            self.console_log, "ab"
        )  # QEMU's own messages; the serial console appends too
        self.proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.dir,
        )
        self._save()
        self._wait_for_agent(self.proc, start + self.boot_timeout, "QEMU")
        self.boot_seconds = time.monotonic() - start
        self.say(
            f"debian: {self.release} up in {self.boot_seconds:.1f} s; agent on 127.0.0.1:{self.ports['agent']}"
        )

    def boot_id(self):
        return self.run(["cat", "/proc/sys/kernel/random/boot_id"]).stdout.strip()

    def reboot(self, timeout=None):
        """`systemctl reboot` in the guest, then back when the agent of the new boot answers;
        the seconds it took (also appended to self.reboot_seconds)."""
        old = self.boot_id()
        start = time.monotonic()
        self.start(["systemctl", "reboot"])
        deadline = start + (timeout or self.boot_timeout)

        def rebooted():
            with contextlib.suppress(OSError, ValueError, GuestError):
                return self.request(
                    "run",
                    argv=["cat", "/proc/sys/kernel/random/boot_id"],
                    timeout=30,
                    connect_timeout=5,
                ).get("stdout", "").strip() not in ("", old)
            return False

        while not rebooted():
            if self.proc.poll() is not None:
                raise GuestError(
                    f"QEMU exited with {self.proc.returncode} during the reboot:\n{self.console_tail()}"
                )
            if time.monotonic() > deadline:
                raise GuestError(
                    f"the guest's agent did not come back within {timeout or self.boot_timeout} s "
                    f"of systemctl reboot:\n{self.console_tail()}"
                )
            time.sleep(1)
        seconds = time.monotonic() - start
        self.reboot_seconds.append(seconds)
        self.say(f"debian: rebooted in {seconds:.1f} s")
        return seconds

    def power_cycle(self, timeout=None):
        """`systemctl poweroff` in the guest, then QEMU started again on the same overlay and NVMe
        images: a shutdown and a cold boot, often faster than reboot() under TCG (a warm reset
        boots slower here). The seconds it took (also appended to self.power_cycle_seconds)."""
        start = time.monotonic()
        self.start(["systemctl", "poweroff"])
        try:
            self.proc.wait(timeout or self.boot_timeout)
        except subprocess.TimeoutExpired:
            raise GuestError(
                f"QEMU did not exit within {timeout or self.boot_timeout} s of systemctl "
                f"poweroff:\n{self.console_tail()}"
            ) from None
        _kill_group(self.proc.pid)  # nothing should be left; QEMU's group is gone then
        self.proc = None
        first = self.boot_seconds
        self._boot_retrying()
        self.boot_seconds = first
        seconds = time.monotonic() - start
        self.power_cycle_seconds.append(seconds)
        self.say(f"debian: power-cycled in {seconds:.1f} s")
        return seconds

    def system_state(self, timeout=300):
        """`systemctl is-system-running --wait`: "running", "degraded", ... once the boot is done."""
        return self.run(
            ["systemctl", "is-system-running", "--wait"], timeout=timeout, check=False
        ).stdout.strip()

    def failed_units(self):
        return self.run(
            ["systemctl", "--failed", "--no-legend", "--plain"], check=False
        ).stdout.strip()

    NAME = "debian"
    POWEROFF_WAIT = 60

    def _ask_poweroff(self):
        self.request("start", argv=["systemctl", "poweroff"], timeout=30, connect_timeout=5)

    def _save(self):
        path = os.path.join(self.dir, vm.JOURNAL)
        _write(path, json.dumps({"pid": os.getpid(), "qemu": self.proc.pid if self.proc else None}))

    # -- files and packages ----------------------------------------------------------------------

    def copy_in(self, host_path, guest_path):
        """Copy a file or directory of the host into the guest (through the lab share); its path in
        the guest. A guest_path ending in / is a directory to copy into (made if need be)."""
        self._copies += 1
        name = os.path.basename(os.path.normpath(host_path))
        staged = os.path.join(self.share, "in", f"{self._copies}")
        os.makedirs(staged)
        if os.path.isdir(host_path):
            shutil.copytree(host_path, os.path.join(staged, name), symlinks=True)
        else:
            shutil.copy2(host_path, staged)
        target = guest_path + name if guest_path.endswith("/") else guest_path
        source = f"{SHARE}/in/{self._copies}/{name}"
        self.run(
            f"mkdir -p {shlex.quote(os.path.dirname(target) or '/')} && "
            f"cp -a {shlex.quote(source)} {shlex.quote(target)} && chown -R root:root {shlex.quote(target)}"
        )
        shutil.rmtree(staged, ignore_errors=True)
        return target

    def apt_install(self, *packages, update=False, timeout=900):
        """`apt-get install -y PACKAGES` in the guest: names from the local repo, or paths of .debs
        in the guest (copy_in) whose dependencies come from it; with `update`, the lists read
        again first (the boot read them once); Result."""
        if update:
            self.run("apt-get update -q", timeout=timeout)
        return self.run(["apt-get", "install", "-y", "-q", *packages], timeout=timeout)

    def unit_active(self, unit):
        return self.run(["systemctl", "is-active", unit], check=False).stdout.strip()


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="The VM lab's Debian host: build the image (and the local repo) ahead."
    )
    ap.add_argument("what", choices=("image", "repo"), nargs="*", default=["image", "repo"])
    ap.add_argument(
        "--kernel", default="6.1", help="one of vm.KERNELS with an initrd (default 6.1)"
    )
    args = ap.parse_args(argv)
    problems = missing(args.kernel)
    if problems:
        print("the Debian host needs: " + "; ".join(problems), file=sys.stderr)
        return 1
    image = build_image(args.kernel, say=vm.say)
    print(image.path)
    if "repo" in args.what:
        print(build_repo(kernel=args.kernel, image=image, say=vm.say))
    return 0


if __name__ == "__main__":
    sys.exit(main())
