"""The chart's pod run by podman on this host, as a kubelet would run it: what the tests of the
chart share (test_chart.py, test_podman.py).

`helm template` renders the chart; Pod turns its DaemonSet's pod spec into podman invocations,
one per container, each field mapped to the podman option that asks runc for the same thing:

    securityContext.runAsUser/runAsGroup      --user UID:GID
    .readOnlyRootFilesystem                   --read-only --read-only-tmpfs=false (no tmpfs: as
                                              Kubernetes, nothing writable but the volumes)
    .allowPrivilegeEscalation: false          --security-opt no-new-privileges
    .capabilities drop / add                  --cap-drop / --cap-add
    .privileged                               --privileged
    .seccompProfile Localhost NAME            --security-opt seccomp=KUBELET_ROOT/seccomp/NAME, the
                                              file the init container installed (the same JSON
                                              format: runc reads it either way)
    .seccompProfile RuntimeDefault            podman's default profile (containerd's and CRI-O's
                                              differ in detail; all refuse bpf() without
                                              CAP_SYS_ADMIN)
    volumes: emptyDir                         a directory of the test's, shared by the containers
                                              (medium Memory: a tmpfs of its sizeLimit mounted
                                              there, as the kubelet mounts it)
             hostPath                         the path itself, bound (podman's -v binds
                                              recursively, as the kubelet's runtimes do); the test
                                              renders kubeletRoot into a directory of its own, and
                                              /proc is the host's procfs (podman binds it as any
                                              directory; the container's own /proc stays beside it)
             configMap                        the rendered ConfigMap's data written to files
    volumeMounts readOnly                     :ro
    the runtime's masked paths                containerd's: podman's also mask /sys/dev/block,
                                              which is unmasked (--security-opt unmask=)
    the pod's network namespace               the first container's (--network none: loopback
                                              only), joined by the others (--network container:)

Podman runs on this host (Local) or in a VM-lab guest (InGuest). Runtime flags this machine needs: runc (crun refuses the hybrid cgroup hierarchy), cgroupfs, and
explicit ulimits (podman's defaults fail with EPERM here).
"""

import contextlib
import json
import os
import subprocess
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHART = os.path.join(REPO, "charts", "blockstack-merges")
BUILD = os.path.join(REPO, ".build")
HELM = os.path.join(BUILD, "bin", "helm")
KUBECONFORM = os.path.join(BUILD, "bin", "kubeconform")
SCHEMAS = os.path.join(BUILD, "k8s-schemas")
PODMAN = [
    "podman",
    "--runtime",
    "runc",
    "--cgroup-manager=cgroupfs",
]
RUN_FLAGS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
PODMAN_DEFAULT_SECCOMP = "/usr/share/containers/seccomp.json"


def version():
    with open(os.path.join(REPO, "VERSION")) as f:
        return f.read().strip()


IMAGE = f"localhost/blockstack-merges-exporters:{version()}"


def helm(*args, timeout=60):
    return subprocess.run(
        [HELM, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def render(values=(), kube_version="1.33.5"):
    """`helm template` of the chart with `values` (KEY=VALUE strings): the list of documents."""
    args = ["template", "t", CHART, "--kube-version", kube_version]
    for v in values:
        args += ["--set", v]
    r = helm(*args)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


class Local:
    """Where podman runs: this host."""

    podman = PODMAN

    @staticmethod
    def run(argv, timeout):
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


class InGuest:
    """Where podman runs: a VM-lab guest (blockstack_lab.vm.Guest), its storage on the guest's
    /tmp (vfs: the guest's root is the host's, read-only); the pod's files in the guest's
    directory, which host and guest share at the same path."""

    podman = [
        "podman",
        "--root",
        "/tmp/podman/root",
        "--runroot",
        "/tmp/podman/run",
        "--storage-driver",
        "vfs",
        "--runtime",
        "runc",
        "--cgroup-manager=cgroupfs",
    ]

    def __init__(self, guest):
        self.guest = guest

    def run(self, argv, timeout):
        r = self.guest.run(list(argv), check=False, timeout=timeout)
        return subprocess.CompletedProcess(argv, r.rc, r.stdout, r.stderr)


LOCAL = Local()


def podman(*args, timeout=120, check=True, host=LOCAL):
    r = host.run([*host.podman, *args], timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {r.returncode}\n{r.stderr}")
    return r


def image_present():
    return podman("image", "exists", IMAGE, check=False).returncode == 0


class Pod:
    """The DaemonSet's pod of `documents` (render()), its volumes under `workdir`."""

    def __init__(self, documents, workdir, name, kubelet_root, host=LOCAL):
        self.docs = documents
        self.kubelet_root = kubelet_root
        self.host = host
        self.workdir = workdir
        self.name = name
        self.spec = self.kind("DaemonSet")["spec"]["template"]["spec"]
        self.started = []
        self.mounts = []
        self.runs = 0
        self.volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        self.paths = {}
        for name_, volume in self.volumes.items():
            self.paths[name_] = self._volume(name_, volume)

    def kind(self, kind, name_suffix=""):
        for d in self.docs:
            if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix):
                return d
        raise KeyError(kind)

    def _volume(self, name, volume):
        if "emptyDir" in volume:
            path = os.path.join(self.workdir, "emptydir", name)
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o777)  # the kubelet's emptyDir mode
            if volume["emptyDir"].get("medium") == "Memory":  # a tmpfs, as the kubelet mounts it
                size = volume["emptyDir"].get("sizeLimit", "1Mi").replace("Mi", "m")
                argv = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", path]
                r = self.host.run(argv, timeout=30)
                assert r.returncode == 0, r.stderr
                self.mounts.append(path)
            return path
        if "hostPath" in volume:
            path = volume["hostPath"]["path"]
            kind = volume["hostPath"].get("type")
            if kind == "DirectoryOrCreate":
                os.makedirs(path, exist_ok=True)
            elif kind == "Directory":  # the kubelet refuses to start the pod without it
                assert os.path.isdir(path), f"volume {name}: hostPath {path} is no directory"
            return path
        if "configMap" in volume:
            cm = self.kind("ConfigMap", volume["configMap"]["name"])
            path = os.path.join(self.workdir, "configmap", name)
            os.makedirs(path, exist_ok=True)
            for key, text in cm["data"].items():
                with open(os.path.join(path, key), "w") as f:
                    f.write(text)
            return path
        raise AssertionError(f"volume {name}: no mapping to podman for {sorted(volume)}")

    def container(self, name):
        for c in self.spec.get("initContainers", []) + self.spec["containers"]:
            if c["name"] == name:
                return c
        raise KeyError(name)

    def security(self, container):
        """The container's effective securityContext: the pod's seccompProfile under its own."""
        ctx = dict(container.get("securityContext") or {})
        pod = self.spec.get("securityContext") or {}
        if "seccompProfile" not in ctx and "seccompProfile" in pod:
            ctx["seccompProfile"] = pod["seccompProfile"]
        return ctx

    def seccomp_path(self, profile):
        """Where the kubelet reads a Localhost profile: kubeletRoot/seccomp/NAME."""
        return os.path.join(self.kubelet_root, "seccomp", profile["localhostProfile"])

    def argv(self, container, command=None, security=None, detach=False, network=None, name=None):
        """`podman run` of one container; `command` replaces its command and args, `security`
        its effective securityContext (an ablation)."""
        ctx = self.security(container) if security is None else security
        out = ["run", *RUN_FLAGS, "--name", name or f"{self.name}-{container['name']}"]
        out += ["-d"] if detach else ["--rm"]
        if network:
            out += ["--network", network]
        elif self.started:
            out += ["--network", f"container:{self.started[0]}"]
        else:
            out += ["--network", "none"]
        # podman masks /sys/dev/block (containers-common's masked paths); containerd's default
        # spec does not, and blockstack-exporter names device numbers through it
        out += ["--security-opt", "unmask=/sys/dev/block"]
        if ctx.get("privileged"):
            out.append("--privileged")
        if "runAsUser" in ctx:
            out += ["--user", f"{ctx['runAsUser']}:{ctx.get('runAsGroup', ctx['runAsUser'])}"]
        if ctx.get("readOnlyRootFilesystem"):
            out += ["--read-only", "--read-only-tmpfs=false"]
        if ctx.get("allowPrivilegeEscalation") is False:
            out += ["--security-opt", "no-new-privileges"]
        caps = ctx.get("capabilities") or {}
        out += [f"--cap-drop={c}" for c in caps.get("drop", [])]
        out += [f"--cap-add={c}" for c in caps.get("add", [])]
        profile = ctx.get("seccompProfile") or {}
        if profile.get("type") == "Localhost":
            out += ["--security-opt", f"seccomp={self.seccomp_path(profile)}"]
        elif profile.get("type") == "Unconfined":
            out += ["--security-opt", "seccomp=unconfined"]
        for env in container.get("env", []):
            out += ["-e", f"{env['name']}={env['value']}"]
        for m in container.get("volumeMounts", []):
            ro = ":ro" if m.get("readOnly") else ""
            out += ["-v", f"{self.paths[m['name']]}:{m['mountPath']}{ro}"]
        out.append(container["image"])
        out += command if command is not None else container["command"] + container.get("args", [])
        return out

    def run(self, name, command=None, security=None, timeout=180):
        """One container to completion (an init container, a check): CompletedProcess."""
        self.runs += 1
        return self.podman(
            *self.argv(
                self.container(name),
                command,
                security,
                network="none",
                name=f"{self.name}-{name}-run{self.runs}",
            ),
            timeout=timeout,
            check=False,
        )

    def start(self, name, security=None):
        container = self.container(name)
        self.podman(*self.argv(container, security=security, detach=True))
        self.started.append(f"{self.name}-{name}")

    def podman(self, *args, timeout=120, check=True):
        return podman(*args, timeout=timeout, check=check, host=self.host)

    def exec(self, name, *argv, timeout=60):
        return self.podman("exec", f"{self.name}-{name}", *argv, timeout=timeout)

    def http_get(self, port, via):
        """GET http://127.0.0.1:PORT/metrics inside the pod's network namespace (from the
        container `via`, with its python3)."""
        code = (
            "import sys, urllib.request\n"
            f"sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:{port}/metrics', "
            "timeout=20).read().decode())"
        )
        return self.exec(via, "python3", "-c", code).stdout

    def pid(self, name):
        r = self.podman("inspect", "--format", "{{.State.Pid}}", f"{self.name}-{name}")
        return int(r.stdout.strip())

    def status(self, name):
        """{field: value} of the container's first process's /proc/PID/status."""
        r = self.host.run(["cat", f"/proc/{self.pid(name)}/status"], timeout=30)
        return dict(line.split(":\t", 1) for line in r.stdout.splitlines() if ":\t" in line)

    def logs(self, name):
        r = self.podman("logs", f"{self.name}-{name}", check=False)
        return r.stdout + r.stderr

    def stop(self):
        for c in reversed(self.started):
            self.podman("rm", "-f", "-t", "2", c, check=False)
        self.started = []
        for path in reversed(self.mounts):
            self.host.run(["umount", path], timeout=30)
        self.mounts = []

    def read(self, volume, name):
        """A file of a volume, as the host running podman sees it."""
        r = self.host.run(["cat", os.path.join(self.paths[volume], name)], timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout


@contextlib.contextmanager
def pod(values=(), name="bsm-chart-test", host=LOCAL, directory=None):
    """The chart rendered with `values` and the kubelet's root in a directory of the test's (in
    `directory`); yields a Pod whose init containers have run; every container removed on exit."""
    with tempfile.TemporaryDirectory(prefix="bsm-chart-", dir=directory) as workdir:
        kubelet = os.path.join(workdir, "kubelet")
        docs = render([f"seccomp.kubeletRoot={kubelet}", *values])
        p = Pod(docs, workdir, f"{name}-{os.getpid()}", kubelet, host)
        try:
            for c in p.spec.get("initContainers", []):
                r = p.run(c["name"])
                assert r.returncode == 0, f"init container {c['name']}: {r.stderr}"
            yield p
        finally:
            p.stop()


def load_json(path):
    with open(path) as f:
        return json.load(f)
