"""The fleet's credentials: three kinds, each opening one thing (docs/fleet.md "Security").

    admin    central only: the Alertmanager peers (127.0.0.1, basic auth): silences, reads, the
             watcher's alerts. It never leaves the central machine.
    scrape   central only: what the watcher sends to every agent's sidecar HTTP (/metrics). Agents
             hold only its bcrypt hash (their sidecars' web config), so one host cannot read another.
    push     one per host (user = the host's name): accepted only by the alert gates
             (alert_gate.py) and only for `POST /api/v2/alerts` of alerts labelled with that host.

On the central machine, in the fleet secrets directory (0700; default STATE/secrets/fleet):

    ca.crt ca.key central.* query.*    the fleet CA, the gates' certificate, Thanos Query's client one
    admin-password  scrape-password     (+ .bcrypt)
    push-credentials.json               {host: sha256 of its push secret}, read by the gates
    hosts/HOST/                         what HOST gets (`stackctl.py fleet-cert`): ca.crt, HOST.crt,
                                        HOST.key, push-password, scrape-password.bcrypt

An agent's secrets directory is a copy of its hosts/HOST/ (HostSecrets). Revoking a host: delete
its entry from push-credentials.json (the gates re-read it) and its line from the inventory.
"""

import json
import os
import shutil

import yaml

from . import pki
from .alert_gate import digest
from .files import secret, write_if_changed

SCRAPE_USER = "scrape"
PUSH_PASSWORD = "push-password"
SCRAPE_HASH = "scrape-password.bcrypt"


class CentralSecrets(pki.Secrets):
    """The central side's directory; as a pki.Secrets it is the admin's (user admin)."""

    def __init__(self, directory):
        super().__init__(directory, user="admin")
        self.scrape = pki.Secrets(directory, user=SCRAPE_USER)

    @property
    def push_credentials(self):
        return os.path.join(self.dir, "push-credentials.json")

    def ensure(self, server_names=(), client_names=(), single_use=False):
        super().ensure(server_names, client_names, single_use)
        self.scrape.hashed()
        if not os.path.exists(self.push_credentials):
            write_if_changed(self.push_credentials, "{}\n", private=True)
        return self

    def host_dir(self, host):
        return os.path.join(self.dir, "hosts", host)

    def issue(self, host, address):
        """HOST's certificate (for its fleet address) and push secret, its entry in
        push-credentials.json, and hosts/HOST/ with everything the host needs. Returns its HostSecrets."""
        self.ensure(server_names={host: [address]})
        bundle = HostSecrets(self.host_dir(host), host)
        os.makedirs(bundle.dir, mode=0o700, exist_ok=True)
        for src, dst in zip((self.ca, *self.cert(host)), (bundle.ca, *bundle.cert(host))):
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o600)
        write_if_changed(bundle.scrape_hash_file, self.scrape.hashed() + "\n", private=True)
        with open(self.push_credentials) as f:
            hashes = json.load(f)
        hashes[host] = digest(secret(bundle.push_password_file))
        write_if_changed(
            self.push_credentials, json.dumps(hashes, indent=1, sort_keys=True) + "\n", private=True
        )
        return bundle


class HostSecrets:
    """One agent host's secrets directory (a copy of the central hosts/HOST/)."""

    def __init__(self, directory, host):
        self.dir, self.host = os.path.abspath(directory), host

    @property
    def ca(self):
        return os.path.join(self.dir, "ca.crt")

    def cert(self, name):
        return os.path.join(self.dir, f"{name}.crt"), os.path.join(self.dir, f"{name}.key")

    @property
    def push_password_file(self):
        return os.path.join(self.dir, PUSH_PASSWORD)

    @property
    def scrape_hash_file(self):
        return os.path.join(self.dir, SCRAPE_HASH)

    def files(self, secure):
        """What must be here: the push secret, the scrape hash; with a listener beyond loopback also TLS."""
        return [self.push_password_file, self.scrape_hash_file] + (
            [self.ca, *self.cert(self.host)] if secure else []
        )

    def push_client(self, tls):
        """The alerting block of the agent's Prometheus: its own push secret, to the gates."""
        block = {"basic_auth": {"username": self.host, "password_file": self.push_password_file}}
        if tls:
            block.update(scheme="https", tls_config={"ca_file": self.ca})
        return block

    def sidecar_web_config(self, path, tls=True):
        """The sidecars' --http.config: basic auth of the central's scrape user (also on loopback:
        it guards their /debug/pprof/), TLS with the host's certificate."""
        with open(self.scrape_hash_file) as f:
            hashed = f.read().strip()
        config = {"basic_auth_users": {SCRAPE_USER: hashed}}
        if tls:
            crt, key = self.cert(self.host)
            config["tls_server_config"] = {
                "cert_file": crt,
                "key_file": key,
                "min_version": "TLS12",
            }
        write_if_changed(
            path,
            "# rendered by blockstack_deploy/fleet_auth.py: the central's scrape user, TLS\n"
            + yaml.safe_dump(config, sort_keys=False),
            private=True,
        )
