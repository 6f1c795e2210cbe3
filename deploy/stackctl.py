#!/usr/bin/env python3
"""Run the Block Stack Merges stack on this host under supervisord (blockstack_deploy).

    stackctl.py up [--state DIR] [--port NAME=PORT ...] [--listen ADDR] [--auth]
                   [--tls-cert F --tls-key F [--tls-ca F]] [--external-host NAME]
                   [--page-email ADDR [--smtp [USER@]HOST:PORT]] [--page-chat SERVICE]
                   [--servers debian|upstream]
    stackctl.py down | status | logs [NAME] | clean [--force] | render      (all take --state)
    stackctl.py up --role agent --host NAME --listen ADDR --alertmanager ADDR:PORT ...
                   [--replica A ...]
    stackctl.py up --role central --listen ADDR [--inventory FILE] [--cluster-peer ADDR:PORT ...]
    stackctl.py fleet-cert --host NAME --address ADDR   (central side: a host's certificate and
                                                         push secret)
    stackctl.py install-systemd [the options of up]    (the same commands as systemd units)

--state and --servers go before or after the command.

`up` renders the configuration into the state directory, starts supervisord there (or updates
the one already running), waits until every component's health endpoint answers and prints
where to look. A second `up` with nothing changed touches nothing. `down` stops everything and
keeps the data; `clean` also removes what `up` regenerates (configuration, logs) but keeps the
TSDB, the pages, Grafana's database and the secrets (the CA) unless given --force
(`make clean FORCE=1`).

Everything listens on 127.0.0.1. `--listen 0.0.0.0` exposes Prometheus and Alertmanager (and
Grafana) only with basic auth over TLS: a generated password (user admin) kept 0600 in
STATE/secrets, hashed into a Prometheus-family `--web.config.file`, and a certificate from a CA
made there (blockstack_deploy/pki.py); Prometheus, Grafana and stackctl itself use both. `--auth`
turns the same on for the loopback listeners (docs/deploy.md "Security"). Exposure comes from
these flags only, never from the environment. Exporters always stay on loopback.

Roles (docs/fleet.md; blockstack_deploy/roles/): `--role agent` runs the exporters, one
Prometheus per `--replica` evaluating alerts/alerts.rules.yml + recording.rules.yml and a Thanos
sidecar each on `--listen` (TLS + the central's scrape user, gRPC mutual TLS) and pushes alerts
with the host's own secret; `--role central` runs Thanos Query (Grafana's datasource), two
Alertmanager peers in a cluster on 127.0.0.1 (admin password), each behind an alert gate on
`--listen` (TLS) that takes only a host's pushes of its own alerts, the watcher Prometheus
(BlockStackHostDown) and the page receiver. The default role is the single-host stack above.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

from blockstack_deploy import fleet_auth, paging, roles, systemd
from blockstack_deploy.files import write_if_changed
from blockstack_deploy.stack import DEFAULT_SERVERS, REPO, SERVERS
from blockstack_deploy.supervisor import Supervisor

KEPT = ("data", "pages", "grafana", "secrets")  # what `clean` keeps without --force


def cmd_up(args, state):
    Supervisor(state, role_of(args, state)).up()


def cmd_install_systemd(args, state):
    systemd.install(role_of(args, state))


def cmd_render(args, state):
    Supervisor(state, role_of(args, state)).render()
    print(f"rendered into {state}")


def cmd_down(args, state):
    if set_up(state):
        Supervisor(state).down()


def cmd_status(args, state):
    if not set_up(state):
        return
    s = Supervisor(state)
    if s.pid() is None:
        print("not running (make up)")
        sys.exit(3)
    r = s.ctl("status", check=False)
    print(r.stdout, end="")
    sys.exit(0 if r.returncode == 0 else 3)


def cmd_logs(args, state):
    if not set_up(state):
        return
    logs = os.path.join(state, "logs")
    names = (
        [args.name] if args.name else sorted(f[:-4] for f in os.listdir(logs) if f.endswith(".log"))
    )
    for n in names:
        print(f"==> {logs}/{n}.log <==")
        subprocess.run(["tail", "-n", "20", os.path.join(logs, f"{n}.log")])


def cmd_clean(args, state):
    if os.path.exists(os.path.join(state, "supervisord.pid")):
        Supervisor(state).down()
    kept = [] if args.force else [n for n in KEPT if os.path.exists(os.path.join(state, n))]
    if not kept:
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(roles.self_pages_dir(state), ignore_errors=True)
        print(f"removed {state}")
        return
    for name in os.listdir(state):
        if name not in kept:
            path = os.path.join(state, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
    print(
        f"removed the configuration and logs in {state}; kept {', '.join(kept)} "
        f"(the TSDB, pages, Grafana's database, secrets): `make clean FORCE=1` removes them too"
    )


def cmd_fleet_cert(args, state):
    bundle = fleet_auth.CentralSecrets(
        args.fleet_secrets or os.path.join(state, "secrets", "fleet")
    ).issue(args.host, args.address)
    print(
        f"copy the files in {bundle.dir} ({', '.join(sorted(os.listdir(bundle.dir)))}) to "
        f"{args.host}'s fleet secrets directory (0700); the central alert gates take its push "
        "secret from now on"
    )


def set_up(state):
    """Whether `up` has rendered this state directory; says so when not."""
    if os.path.exists(os.path.join(state, "supervisord.conf")):
        return True
    print(f"not set up in {state} (make up)")
    return False


def role_of(args, state):
    """The role of up, install-systemd and render: the options given, or for the default role
    those a fleet role was brought up with on this state (STATE/role.json)."""
    fleet_opts = {
        "host": args.host,
        "replicas": args.replica,
        "alertmanagers": args.alertmanager,
        "secrets": args.fleet_secrets,
        "inventory": args.inventory,
        "cluster_peers": args.cluster_peer,
    }
    role_file = os.path.join(state, "role.json")
    if args.command == "up" and args.role != "standalone":
        os.makedirs(state, exist_ok=True)
        saved = {"role": args.role, "listen": args.listen, "fleet": fleet_opts}
        write_if_changed(role_file, json.dumps(saved, indent=1) + "\n")
    elif args.role == "standalone" and os.path.exists(role_file):
        with open(role_file) as f:
            saved = json.load(f)
        args.role, args.listen, fleet_opts = saved["role"], saved["listen"], saved["fleet"]
    ports = {}
    try:
        with open(os.path.join(state, "ports.json")) as f:
            ports = json.load(f)
    except FileNotFoundError:
        pass
    known = roles.ROLES[args.role].PORTS
    for item in args.port:
        name, _, port = item.partition("=")
        if name not in known or not port.isdigit():
            args.parser.error(f"--port {item}: expected NAME=PORT with NAME in {', '.join(known)}")
        ports[name] = int(port)
    if bool(args.tls_cert) != bool(args.tls_key):
        args.parser.error("--tls-cert and --tls-key go together")
    tls = (args.tls_cert, args.tls_key, args.tls_ca or args.tls_cert) if args.tls_cert else None
    if tls and roles.loopback(args.listen) and not args.auth:
        args.parser.error(
            "--tls-cert is for --listen ADDR or --auth (nothing serves TLS on the loopback default)"
        )
    if args.external_host and args.role != "standalone":
        args.parser.error("--external-host is for the standalone role")
    role = roles.make(
        args.role,
        state,
        ports,
        args.listen,
        auth=args.auth,
        tls=tls,
        external_host=args.external_host,
        **fleet_opts,
    )
    knobs = paging.Paging(
        email=args.page_email,
        email_from=args.page_email_from,
        smtp=args.smtp,
        chat=args.page_chat or "",
        chat_url=args.page_chat_url,
        secrets_dir=os.path.join(state, "secrets"),
    )
    if knobs:
        if args.role != "standalone":
            args.parser.error("--page-email and --page-chat are for the standalone role")
        role.stack.paging = knobs
    return role


def global_options(p, default):
    """--state and --servers, on the main parser (default: their defaults) and on every command
    (default: argparse.SUPPRESS, so that one given before the command stays)."""
    p.add_argument(
        "--state",
        default=default(None),
        help="state directory (default $STATE_DIR or .state in the repository)",
    )
    p.add_argument(
        "--servers",
        choices=list(SERVERS),
        default=default(os.environ.get("BLOCKSTACK_SERVERS") or DEFAULT_SERVERS),
        help="Prometheus and Alertmanager: debian (Debian's packages, Prometheus 2) or upstream "
        "(Prometheus 3, built by make upstream-servers); default $BLOCKSTACK_SERVERS or "
        f"{DEFAULT_SERVERS}",
    )


def role_options(p):
    """The options of up, install-systemd and render."""
    p.add_argument(
        "--port",
        action="append",
        default=[],
        metavar="NAME=PORT",
        help=f"override a port ({', '.join(roles.Standalone.PORTS)})",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1",
        help="address for Prometheus, Alertmanager and Grafana; anything but loopback turns on "
        "TLS + basic auth",
    )
    p.add_argument(
        "--auth",
        action="store_true",
        help="TLS + basic auth on Prometheus, Alertmanager and Grafana also on loopback "
        '(docs/deploy.md "Security")',
    )
    p.add_argument(
        "--external-host",
        metavar="NAME",
        help="the name readers of a page use to reach this host: the links of every page "
        "(Prometheus, Alertmanager, Grafana, the runbook) name it instead of the --listen address "
        '(docs/deploy.md "Links in a page")',
    )
    p.add_argument(
        "--tls-cert",
        help="with --listen/--auth: your server certificate (PEM; naming the --listen address, "
        "127.0.0.1 for 0.0.0.0) instead of one from a CA generated in STATE/secrets",
    )
    p.add_argument("--tls-key", help="its private key")
    p.add_argument(
        "--tls-ca", help="the CA certificate that signed it (default: the certificate itself)"
    )
    page = p.add_argument_group(
        'paging a person, beside the pages file (docs/deploy.md "Paging a person"); give them '
        "on every up, as --listen"
    )
    page.add_argument(
        "--page-email",
        metavar="ADDR[,ADDR]",
        default="",
        help="mail every page and ticket to these addresses",
    )
    page.add_argument(
        "--page-email-from",
        metavar="ADDR",
        default="",
        help="the mail's sender (default blockstack-merges@HOST)",
    )
    page.add_argument(
        "--smtp",
        metavar="[USER@]HOST:PORT",
        default=paging.SMTP_DEFAULT,
        help="the mail server (default %(default)s, this host's MTA); USER's password in "
        "STATE/secrets/smtp-password",
    )
    page.add_argument(
        "--page-chat",
        choices=paging.CHAT_SERVICES,
        help="also send every page and ticket to this service; its URL or key in "
        "STATE/secrets/page-chat",
    )
    page.add_argument(
        "--page-chat-url",
        metavar="URL",
        default="",
        help="the service's API when not its default (Opsgenie EU: https://api.eu.opsgenie.com/)",
    )
    fleet = p.add_argument_group("fleet roles (docs/fleet.md)")
    fleet.add_argument("--role", choices=list(roles.ROLES), default="standalone")
    fleet.add_argument(
        "--host", help="agent: this host's name (the `host` label; default the hostname)"
    )
    fleet.add_argument(
        "--replica",
        action="append",
        default=[],
        help="agent: a Prometheus replica name (A, B); repeat for two",
    )
    fleet.add_argument(
        "--alertmanager",
        action="append",
        default=[],
        metavar="ADDR:PORT",
        help="agent: a central Alertmanager peer; repeat for every peer",
    )
    fleet_secrets_option(fleet)
    fleet.add_argument(
        "--inventory",
        help="central: the file_sd inventory of agent sidecars (default STATE/inventory.yml)",
    )
    fleet.add_argument(
        "--cluster-peer",
        action="append",
        default=[],
        metavar="ADDR:PORT",
        help="central: an Alertmanager peer on another central machine (its cluster port)",
    )


def fleet_secrets_option(p):
    p.add_argument(
        "--fleet-secrets",
        help="the fleet credentials: central, all of them; agent, the host's copy of hosts/HOST "
        "(default STATE/secrets/fleet)",
    )


def parser():
    p = argparse.ArgumentParser(
        prog="stackctl.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    global_options(p, lambda value: value)
    common = argparse.ArgumentParser(add_help=False)
    global_options(common, lambda value: argparse.SUPPRESS)
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, run, help):
        sub = commands.add_parser(name, parents=[common], help=help)
        sub.set_defaults(run=run, parser=sub)
        return sub

    role_options(command("up", cmd_up, "render, start or update, wait until healthy"))
    command("down", cmd_down, "stop everything, keep the data")
    command("status", cmd_status, "supervisord's status of every component (exit 3: not running)")
    command("logs", cmd_logs, "the last 20 lines of every component's log").add_argument(
        "name", nargs="?", help="one component's log"
    )
    command("clean", cmd_clean, "stop and remove the configuration and logs").add_argument(
        "--force", action="store_true", help="remove the data, pages and secrets too"
    )
    role_options(command("render", cmd_render, "render the configuration only"))
    fleet_cert = command(
        "fleet-cert", cmd_fleet_cert, "central side: a host's certificate and push secret"
    )
    fleet_cert.add_argument("--host", required=True, help="the host's name")
    fleet_cert.add_argument(
        "--address", required=True, help="the address the host's sidecar listens on"
    )
    fleet_secrets_option(fleet_cert)
    role_options(
        command("install-systemd", cmd_install_systemd, "the role's commands as systemd units")
    )
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    os.environ["BLOCKSTACK_SERVERS"] = args.servers  # read by every Stack and role of this run
    state = os.path.abspath(
        args.state or os.environ.get("STATE_DIR") or os.path.join(REPO, ".state")
    )
    args.run(args, state)


if __name__ == "__main__":
    main()
