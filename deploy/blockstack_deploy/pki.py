"""The credentials of every listener beyond loopback: a private CA and certificates made with the
openssl command line, a generated basic-auth password and its bcrypt, and the Prometheus-family
web config that serves them.

Thanos's gRPC (Query -> sidecar StoreAPI) has no basic auth; it gets mutual TLS instead: each
sidecar presents a server certificate for its address and accepts only clients whose certificate
the fleet CA signed (Thanos Query's client certificate). `make up-agent`, `make up-central`,
`make up --listen/--auth` and the fleet test use these helpers; on real
hosts use your own CA the same way (docs/fleet.md).
"""

import ipaddress
import os
import secrets as random
import subprocess
import tempfile

import yaml

from .files import secret, write_if_changed, write_private

DAYS = 825  # the longest validity TLS clients still accept for leaf certificates
CA_DAYS = 1095  # a CA outlives its leaves by a little: 3 years, not 9
# bcrypt cost of every generated web password (fleet and `make up --listen/--auth`). Slow hashing
# protects guessable passwords from offline cracking; ours are generated 144-bit secrets, so it buys
# nothing, while every wrong password costs the server one hash: cost 12 is ~0.24 s of CPU per
# unauthenticated request (a CPU burn anyone who reaches the port can start), cost 6 is ~4 ms.
BCRYPT_COST = 6


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(directory, name=None, permitted=()):
    """directory/ca.crt and ca.key (P-256), unless they exist; a CN of its own on every install
    (name, default blockstack-ca-RANDOM). permitted: the only names (IPs or DNS names) it may
    sign for (a critical nameConstraints; a browser that trusts it trusts it for nothing else).
    Returns the certificate path."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    crt, key = os.path.join(directory, "ca.crt"), os.path.join(directory, "ca.key")
    if not (os.path.exists(crt) and os.path.exists(key)):
        ext = [
            "-addext",
            "basicConstraints=critical,CA:TRUE,pathlen:0",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]
        if permitted:
            ext += [
                "-addext",
                "nameConstraints=critical,"
                + ",".join(f"permitted;{n}" for n in _constraints(permitted)),
            ]
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key,
            "-out",
            crt,
            "-subj",
            f"/CN={name or 'blockstack-ca-' + random.token_hex(6)}",
            "-days",
            str(CA_DAYS),
            *ext,
        )
        os.chmod(key, 0o600)
    return crt


def _constraints(hosts):
    for h in hosts:
        try:
            ip = ipaddress.ip_address(h)
            yield f"IP:{ip}/{'255.255.255.255' if ip.version == 4 else 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'}"
        except ValueError:
            yield f"DNS:{h}"


def make_cert(directory, name, hosts=(), client=False):
    """directory/NAME.crt and NAME.key signed by directory/ca.*, valid for `hosts` (IPs or DNS
    names) as a server, or as a TLS client when client=True. Returns (crt, key)."""
    crt, key = os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")
    if os.path.exists(crt) and os.path.exists(key):
        return crt, key
    sans = []
    for h in hosts:
        try:
            ipaddress.ip_address(h)
            sans.append(f"IP:{h}")
        except ValueError:
            sans.append(f"DNS:{h}")
    ext = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}",
    ]
    if sans:
        ext.append("subjectAltName=" + ",".join(sans))
    with tempfile.NamedTemporaryFile("w", suffix=".ext", dir=directory, delete=False) as f:
        f.write("\n".join(ext) + "\n")
        extfile = f.name
    csr = os.path.join(directory, f"{name}.csr")
    try:
        _openssl(
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key,
            "-out",
            csr,
            "-subj",
            f"/CN={name}",
        )
        os.chmod(key, 0o600)
        _openssl(
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            os.path.join(directory, "ca.crt"),
            "-CAkey",
            os.path.join(directory, "ca.key"),
            "-CAcreateserial",
            "-out",
            crt,
            "-days",
            str(DAYS),
            "-extfile",
            extfile,
        )
    finally:
        for p in (extfile, csr):
            if os.path.exists(p):
                os.unlink(p)
    return crt, key


def cert_names(crt):
    """The subjectAltName entries of a certificate ("IP Address:127.0.0.1", "DNS:localhost", ...)."""
    out = subprocess.run(
        ["openssl", "x509", "-in", crt, "-noout", "-ext", "subjectAltName"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return {n.strip() for line in out.splitlines()[1:] for n in line.split(",") if n.strip()}


class Secrets:
    """Credentials in one directory (0700): the basic-auth password of `user` (clients read it
    from USER-password), its bcrypt hash, and the private CA with the certificates made from it.
    The fleet's are made on the central side (fleet_auth.CentralSecrets: users admin and scrape,
    and each host's push secret); `make up` makes its own (user admin)."""

    def __init__(self, directory, user="admin"):
        self.dir = os.path.abspath(directory)
        self.user = user

    @property
    def password_file(self):
        return os.path.join(self.dir, f"{self.user}-password")

    @property
    def ca(self):
        return os.path.join(self.dir, "ca.crt")

    def cert(self, name):
        return os.path.join(self.dir, f"{name}.crt"), os.path.join(self.dir, f"{name}.key")

    def password(self):
        return secret(self.password_file)

    def hashed(self):
        """bcrypt of the password, made once (bcrypt is slow on purpose; the servers cache it)."""
        import bcrypt

        path = os.path.join(self.dir, f"{self.user}-password.bcrypt")
        if not os.path.exists(path) or f"${BCRYPT_COST:02d}$" not in open(path).read(
            30
        ):  # made at another cost
            write_private(
                path,
                bcrypt.hashpw(
                    self.password().encode(), bcrypt.gensalt(rounds=BCRYPT_COST)
                ).decode(),
            )
        with open(path) as f:
            return f.read().strip()

    def ensure(self, server_names=(), client_names=(), single_use=False):
        """CA, password and the named certificates: {name: [addresses]} servers, [names] clients.
        single_use: a CA constrained to the servers' names whose key is deleted once they are
        signed (`make up --auth/--listen`: no CA key left on the host; other names need a new CA).
        The fleet's CA keeps its key: `stackctl.py fleet-cert` signs each new host with it."""
        self.password()
        server_names = dict(server_names)
        missing = [n for n in server_names if not all(map(os.path.exists, self.cert(n)))]
        if single_use and missing:
            for f in ("ca.crt", "ca.key"):
                if os.path.exists(os.path.join(self.dir, f)):
                    os.unlink(os.path.join(self.dir, f))
            for n in server_names:  # every certificate from the new CA
                for f in self.cert(n):
                    if os.path.exists(f):
                        os.unlink(f)
        if (
            missing or not single_use
        ):  # a single-use CA with every certificate signed has no key left
            make_ca(
                self.dir,
                permitted=[h for hosts in server_names.values() for h in hosts]
                if single_use
                else (),
            )
        for name, hosts in server_names.items():
            make_cert(self.dir, name, hosts)
        for name in client_names:
            make_cert(self.dir, name, client=True)
        if single_use and os.path.exists(os.path.join(self.dir, "ca.key")):
            os.unlink(os.path.join(self.dir, "ca.key"))
        return self

    def web_config(self, path, cert_name):
        """A Prometheus-family web config (exporter-toolkit: Prometheus, Alertmanager, Thanos
        --http.config): basic auth for `user`, TLS with cert_name's certificate (None: plain
        HTTP, for a listener on loopback)."""
        config = {"basic_auth_users": {self.user: self.hashed()}}
        if cert_name:
            crt, key = self.cert(cert_name)
            config["tls_server_config"] = {
                "cert_file": crt,
                "key_file": key,
                "min_version": "TLS12",
            }
        write_if_changed(
            path,
            f"# rendered by blockstack_deploy/pki.py: basic auth (user {self.user}) and TLS for "
            "listeners beyond loopback\n" + yaml.safe_dump(config, sort_keys=False),
            private=True,
        )

    def client_http(self, tls=True):
        """The `basic_auth` (+ `tls_config`) block of a Prometheus scrape or alerting config."""
        block = {"basic_auth": {"username": self.user, "password_file": self.password_file}}
        if tls:
            block["scheme"] = "https"
            block["tls_config"] = {"ca_file": self.ca}
        return block
