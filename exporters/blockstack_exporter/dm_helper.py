"""The device-mapper helper: the one process of the stack that holds CAP_SYS_ADMIN, which every
DM ioctl needs (drivers/md/dm-ioctl.c ctl_ioctl: "Only root can play with this"), so that
blockstack-exporter, an HTTP listener, holds none.

    python -I -m blockstack_exporter.dm_helper --socket PATH [--dmsetup dmsetup] [--timeout 5]

It answers on a Unix socket in a directory only the exporter's group may enter (privileges.py).
A request is one word, "table" or "status"; it runs `dmsetup table` or `dmsetup status --noflush`
(dmsetup.REQUESTS: nothing from the request reaches the command line) under Dmsetup's bounds
(timeout, output size, a hung dmsetup killed) and answers "ok\\n" and dmsetup's output, or
"error REASON\\n" and the message; then it closes the connection. One request at a time. The
request "events" runs nothing: it answers "ok\\n" and the token of device-mapper's events
(dmsetup.ControlEvents, polled on /dev/mapper/control, which the exporter cannot open), by
which the exporter knows when to ask for the table again.

Capabilities: started with CAP_SYS_ADMIN in its permitted, inheritable and ambient sets
(setpriv, systemd's AmbientCapabilities=), it clears its own ambient set and raises it again only
in each dmsetup child, so no long-running process of the stack has an ambient capability. The
control node /dev/mapper/control is root's 0600; privileges.py gives it the helper's group.
"""

import argparse
import ctypes
import sys

import blockstack_http

from .collectors.dmsetup import EVENTS, REQUESTS, Dmsetup, DmsetupError

PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, PR_CAP_AMBIENT_CLEAR_ALL = (
    47,
    2,
    4,
)  # include/uapi/linux/prctl.h
CAP_SYS_ADMIN = 21  # include/uapi/linux/capability.h
REQUEST_BYTES = 16  # "status\n" and then some
REQUEST_TIMEOUT = 5.0  # seconds a client may take to send its request

_libc = ctypes.CDLL(None, use_errno=True)


def clear_ambient():
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


def raise_ambient():
    """In the dmsetup child, before exec: CAP_SYS_ADMIN ambient, so dmsetup (no file capabilities)
    keeps it. Fails harmlessly without the capability (not root: the stack runs as its user)."""
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_SYS_ADMIN, 0, 0)


def answer(dm, request):
    """The reply to one request (bytes)."""
    if request == EVENTS:
        return b"ok\n" + (dm.events() or "").encode()
    args = REQUESTS.get(request)
    if args is None:
        return (
            b"error command\nunknown request (expected one of: "
            + " ".join([*REQUESTS, EVENTS]).encode()
            + b")\n"
        )
    try:
        return b"ok\n" + dm.run(args).encode()
    except DmsetupError as e:
        return f"error {e.reason}\n{e}\n".encode()


def read_request(conn):
    conn.settimeout(REQUEST_TIMEOUT)
    data = b""
    while b"\n" not in data and len(data) < REQUEST_BYTES:
        chunk = conn.recv(REQUEST_BYTES - len(data))
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode("ascii", "replace")


def serve(path, dm):
    server = blockstack_http.unix_listener(
        path, 16
    )  # in a directory only the exporter's group enters
    while True:
        conn, _ = server.accept()
        with conn:
            try:
                reply = answer(dm, read_request(conn))
                conn.settimeout(dm.timeout)
                conn.sendall(reply)
            except OSError as e:  # the client went away or stalled: the next one is served
                print(f"dm_helper: {e}", file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="dm_helper", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--socket", required=True, help="the Unix socket to answer on")
    p.add_argument("--dmsetup", default="dmsetup", help="dmsetup binary (default %(default)s)")
    p.add_argument(
        "--timeout", type=float, default=5.0, help="seconds before a dmsetup call is abandoned"
    )
    args = p.parse_args(argv)
    clear_ambient()
    serve(
        args.socket,
        Dmsetup(dmsetup=args.dmsetup, timeout=args.timeout, preexec_fn=raise_ambient),
    )


if __name__ == "__main__":
    main()
