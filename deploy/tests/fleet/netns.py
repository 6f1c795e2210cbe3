"""Simulated hosts on one machine: network namespaces on a private bridge, and HTTP from inside them.

    root namespace: bridge BRIDGE with 10.200.K.1/24 (the central side listens there)
    namespace NAME-hI: eth0 10.200.K.(10+I)/24 and its own loopback (an agent's 127.0.0.1)

Addresses exist only on interfaces created here; nothing is routed anywhere else. Everything is
removed on exit (deleting a namespace deletes its veth end, and the bridge goes last).
"""

import contextlib
import ctypes
import os
import subprocess
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args, ns=None, check=True):
    argv = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r.stdout


def free_subnet(tag):
    """A 10.200.K.0/24 not configured on any interface here, starting from tag."""
    used = _ip("-o", "-4", "addr", "show")
    for i in range(250):
        k = (tag + i) % 250 + 1
        if f" 10.200.{k}." not in used:
            return k
    raise RuntimeError("no free 10.200.K.0/24")


@contextlib.contextmanager
def bridged_hosts(names, tag=None):
    """Yields (central_address, {name: (namespace, address)}) for simulated hosts `names`."""
    tag = os.getpid() % 10000 if tag is None else tag
    k = free_subnet(tag)
    bridge = f"bsf{tag}br"
    central = f"10.200.{k}.1"
    hosts = {}
    created = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        created.append(("link", bridge))
        _ip("addr", "add", f"{central}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, name in enumerate(names, start=1):
            ns = f"bsf{tag}-{name}"
            _ip("netns", "add", ns)
            created.append(("netns", ns))
            root_end, ns_end = f"bsf{tag}v{i}", f"bsf{tag}p{i}"
            _ip("link", "add", root_end, "type", "veth", "peer", "name", ns_end)
            created.append(("link", root_end))
            _ip("link", "set", ns_end, "netns", ns)
            _ip("link", "set", root_end, "master", bridge)
            _ip("link", "set", root_end, "up")
            address = f"10.200.{k}.{10 + i}"
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("link", "set", ns_end, "name", "eth0", ns=ns)
            _ip("addr", "add", f"{address}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            hosts[name] = (ns, address)
        yield central, hosts
    finally:
        for kind, name in reversed(created):
            if kind == "netns":
                _ip("netns", "delete", name, check=False)
            else:
                _ip("link", "delete", name, check=False)


def link_down(ns):
    """Cut a simulated host off the network (its processes may keep running)."""
    _ip("link", "set", "eth0", "down", ns=ns)


def call_in(ns, fn, *args, **kwargs):
    """fn(*args) in a thread that has joined network namespace ns (setns is per thread), so
    sockets it opens are that namespace's: e.g. HTTP to an agent's own 127.0.0.1."""
    if ns is None:
        return fn(*args, **kwargs)
    result = {}

    def run():
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {ns}")
            finally:
                os.close(fd)
            result["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def argv_in_net(ns, argv):
    """argv run in namespace ns's network only (nsenter --net): unlike `ip netns exec`, which
    also remounts /sys, the process keeps the root's sysfs and tracefs (ebpf_exporter attaches
    tracepoints through them). nsenter execs argv, so the pid and process group stay the same."""
    return ["nsenter", f"--net=/run/netns/{ns}", "--", *argv] if ns else list(argv)
