"""A private CA and the certificates of a fleet, made with the openssl command line.

Thanos's gRPC (Query -> sidecar StoreAPI) has no basic auth; it gets mutual TLS instead: each
sidecar presents a server certificate for its address and accepts only clients whose certificate
the fleet CA signed (Thanos Query's client certificate). `make up-agent`, `make up-central`,
`make up --listen/--auth` (deploy/stackctl.py) and the fleet test use these helpers; on real
hosts use your own CA the same way (docs/fleet.md).
"""
import ipaddress
import os
import subprocess
import tempfile

DAYS = 825  # the longest validity TLS clients still accept for leaf certificates


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(directory, name="blockstack-fleet-ca"):
    """directory/ca.crt and ca.key (P-256), unless they exist. Returns the certificate path."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    crt, key = os.path.join(directory, "ca.crt"), os.path.join(directory, "ca.key")
    if not (os.path.exists(crt) and os.path.exists(key)):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", key, "-out", crt, "-subj", f"/CN={name}", "-days", str(DAYS * 4),
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        os.chmod(key, 0o600)
    return crt


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
    ext = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
           f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}"]
    if sans:
        ext.append("subjectAltName=" + ",".join(sans))
    with tempfile.NamedTemporaryFile("w", suffix=".ext", dir=directory, delete=False) as f:
        f.write("\n".join(ext) + "\n")
        extfile = f.name
    csr = os.path.join(directory, f"{name}.csr")
    try:
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
        os.chmod(key, 0o600)
        _openssl("x509", "-req", "-in", csr, "-CA", os.path.join(directory, "ca.crt"),
                 "-CAkey", os.path.join(directory, "ca.key"), "-CAcreateserial", "-out", crt,
                 "-days", str(DAYS), "-extfile", extfile)
    finally:
        for p in (extfile, csr):
            if os.path.exists(p):
                os.unlink(p)
    return crt, key


def cert_names(crt):
    """The subjectAltName entries of a certificate ("IP Address:127.0.0.1", "DNS:localhost", ...)."""
    out = subprocess.run(["openssl", "x509", "-in", crt, "-noout", "-ext", "subjectAltName"],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    return {n.strip() for line in out.splitlines()[1:] for n in line.split(",") if n.strip()}
