"""The VM lab's agent: runs inside the guest (vm.py starts it as the guest's last step) and runs
commands for the host, one JSON request and one JSON answer per TCP connection. Standard library
only: the guest runs it with the host's /usr/bin/python3, seen through virtme-ng's read-only view
of the host's root.

    {"token": T, "op": "run", "argv": [...], "timeout": S}  -> {"rc", "stdout", "stderr"}
    {"token": T, "op": "start", "argv": [...]}             -> {"id", "pid"}   (in the background)
    {"token": T, "op": "stop", "id": N}                    -> {"rc", "output"} (SIGTERM, then SIGKILL)
    {"token": T, "op": "poll", "id": N}                    -> {"rc" (null while running), "output"}
    {"token": T, "op": "shutdown"}                         -> {} then the agent exits: the guest powers off

The listener is reachable only through QEMU's user network, whose host-forwarded port is bound to
the host's 127.0.0.1; the token (a file only root reads on the host) keeps the host's other local
users out of the guest, which can read every file of the host.
"""

import argparse
import json
import os
import signal
import socketserver
import subprocess
import sys
import threading

LOG_DIR = "/tmp/blockstack-vm-agent"  # the guest's own tmpfs
MAX_OUTPUT = 1 << 20  # bytes of a background command's output returned


class Agent:
    def __init__(self, token):
        self.token = token
        self.background = {}  # id -> (Popen, log path)
        self.lock = threading.Lock()
        self.done = threading.Event()
        os.makedirs(LOG_DIR, exist_ok=True)

    def handle(self, req):
        if req.get("token") != self.token:
            return {"error": "bad token"}
        op = req.get("op")
        if op == "run":
            try:
                p = subprocess.run(
                    req["argv"],
                    capture_output=True,
                    text=True,
                    errors="replace",
                    timeout=req.get("timeout", 600),
                    stdin=subprocess.DEVNULL,
                )
                return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
            except subprocess.TimeoutExpired as e:
                return {
                    "rc": None,
                    "stdout": _text(e.stdout),
                    "stderr": _text(e.stderr),
                    "error": f"timed out after {req.get('timeout')} s",
                }
            except OSError as e:
                return {"rc": 127, "stdout": "", "stderr": str(e)}
        if op == "start":
            with self.lock:
                n = len(self.background) + 1
                log = os.path.join(LOG_DIR, f"{n}.log")
                with open(log, "wb") as out:
                    try:
                        p = subprocess.Popen(
                            req["argv"],
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            start_new_session=True,
                        )
                    except OSError as e:
                        return {"error": str(e)}
                self.background[n] = (p, log)
            return {"id": n, "pid": p.pid}
        if op in ("stop", "poll"):
            entry = self.background.get(req.get("id"))
            if entry is None:
                return {"error": f"no background command {req.get('id')}"}
            p, log = entry
            if op == "stop":
                _stop(p)
            return {"rc": p.poll(), "output": _tail(log)}
        if op == "shutdown":
            for p, _ in self.background.values():
                _stop(p)
            self.done.set()
            return {}
        return {"error": f"unknown op {op!r}"}


def _text(b):
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _tail(path):
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - MAX_OUTPUT))
        return f.read().decode(errors="replace")


def _stop(p):
    """SIGTERM to the command's process group, SIGKILL after 10 s."""
    if p.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def serve(address, token):
    agent = Agent(token)

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            try:
                req = json.loads(self.rfile.readline())
                answer = agent.handle(req)
            except (ValueError, KeyError, TypeError) as e:
                answer = {"error": f"bad request: {e}"}
            self.wfile.write(json.dumps(answer).encode() + b"\n")

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    with socketserver.ThreadingTCPServer(address, Handler) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        print(f"blockstack-vm-agent: listening on {address[0]}:{address[1]}", flush=True)
        agent.done.wait()
        server.shutdown()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, help="ADDRESS:PORT in the guest")
    ap.add_argument("--token-file", required=True)
    args = ap.parse_args(argv)
    host, port = args.listen.rsplit(":", 1)
    with open(args.token_file) as f:
        token = f.read().strip()
    serve((host, int(port)), token)
    return 0


if __name__ == "__main__":
    sys.exit(main())
