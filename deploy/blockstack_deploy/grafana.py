"""Grafana for the stack: found or unpacked, configured so that no request leaves the host, the
datasource and the "Block Stack Merges" dashboard provisioned. `make up` (roles/) and the
tests (stack.Stack with the "grafana" component) both use it.

    python -m blockstack_deploy.grafana        # find Grafana, unpacking the shared tarball if needed (make grafana)

Where Grafana comes from, in this order:
1. GRAFANA_HOME (an unpacked release tarball: GRAFANA_HOME/bin/grafana);
2. `grafana` or `grafana-server` on PATH (Grafana's APT package; its home is /usr/share/grafana);
3. ../shared/grafana/grafana-VERSION.linux-amd64.tar.xz beside the repository ($SHARED_DIR/grafana
   if set; paths.py), unpacked once
   (sha256 checked against the .sha256 file beside it) into .build/grafana-VERSION/.
Nothing is ever downloaded.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

from .files import secret, write_if_changed, write_yaml
from .paths import BUILD, REPO, SHARED

VERSION = (
    "12.4.0"  # the build in ../shared/grafana, and the only version the tests have run against
)
TARBALL = os.path.join(SHARED, "grafana", f"grafana-{VERSION}.linux-amd64.tar.xz")
CACHE = os.path.join(BUILD, f"grafana-{VERSION}")
APT_HOME = "/usr/share/grafana"
PROVISIONING = os.path.join(REPO, "deploy", "grafana", "provisioning")
DASHBOARDS = os.path.join(REPO, "dashboards")
HINT = (
    f"Grafana not found: set GRAFANA_HOME to an unpacked Grafana tarball, install the `grafana` package "
    f"from Grafana's APT repository (https://apt.grafana.com), or put {os.path.basename(TARBALL)} and its "
    f".sha256 in {os.path.normpath(os.path.dirname(TARBALL))}"
)


def find(unpack_shared=True):
    """(binary, homepath) of a Grafana server, or None when there is none (see the module doc), or
    when BLOCKSTACK_GRAFANA=none (the Debian package runs no Grafana)."""
    if os.environ.get("BLOCKSTACK_GRAFANA") == "none":
        return None
    home = os.environ.get("GRAFANA_HOME")
    if home:
        binary = os.path.join(home, "bin", "grafana")
        return (binary, home) if os.access(binary, os.X_OK) else None
    for name in ("grafana", "grafana-server"):
        path = shutil.which(name)
        if path:
            return path, APT_HOME
    binary = os.path.join(CACHE, "bin", "grafana")
    if os.access(binary, os.X_OK):
        if os.stat(CACHE).st_mode & 0o777 != 0o755 and os.geteuid() == os.stat(CACHE).st_uid:
            os.chmod(
                CACHE, 0o755
            )  # unpacked 0700 by an older version: Grafana's own user must get in
        return binary, CACHE
    if unpack_shared and os.path.exists(TARBALL):
        unpack(TARBALL, CACHE)
        return binary, CACHE
    return None


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def unpack(tarball, dest):
    """Check tarball against its .sha256 file and unpack it into dest (atomically: a half-unpacked
    tree is never left at dest, and two unpacks at once both end with one complete tree)."""
    with open(tarball + ".sha256") as f:
        expected = f.read().split()[0]
    actual = sha256(tarball)
    if actual != expected:
        raise RuntimeError(
            f"{tarball}: sha256 {actual}, expected {expected} (from its .sha256 file)"
        )
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(dest) + ".", dir=os.path.dirname(dest))
    try:
        subprocess.run(["tar", "-xJf", tarball, "-C", tmp], check=True, timeout=600)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would keep Grafana's own user (privileges.py) out
        try:
            os.rename(tmp, dest)
        except OSError:  # another unpack won the race
            if not os.access(os.path.join(dest, "bin", "grafana"), os.X_OK):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ini(
    port,
    data_dir,
    provisioning,
    password_file,
    listen="127.0.0.1",
    tls=None,
    secret_key_file=None,
    root_url=None,
):
    """grafana.ini: our paths and port, the URL its readers reach it at (root_url: its links and
    redirects; Grafana's default names localhost), a generated admin password and secret_key (Grafana's
    public default would decrypt the datasource password in grafana.db), no anonymous access,
    strict same-site cookies and a CSP (secure cookies and HSTS with https), and every feature
    that calls out to the internet turned off (a monitoring host may have no internet)."""
    https = (
        (
            "cookie_secure = true\nstrict_transport_security = true\n"
            "strict_transport_security_max_age_seconds = 31536000\n"
        )
        if tls
        else ""
    )
    return f"""# rendered by blockstack_deploy/grafana.py: edit the source, not this file
[paths]
data = {data_dir}
logs = {data_dir}/log
plugins = {data_dir}/plugins
provisioning = {provisioning}

[server]
http_addr = {listen}
http_port = {port}
{f"root_url = {root_url}/{chr(10)}" if root_url else ""}{"" if not tls else f"protocol = https{chr(10)}cert_file = {tls[0]}{chr(10)}cert_key = {tls[1]}{chr(10)}"}
[security]
admin_user = admin
admin_password = $__file{{{password_file}}}
{f"secret_key = $__file{{{secret_key_file}}}{chr(10)}" if secret_key_file else ""}cookie_samesite = strict
content_security_policy = true
{https}# avatars would be fetched from gravatar.com
disable_gravatar = true

[auth.anonymous]
enabled = false

[analytics]
# usage reports, version checks of Grafana and of plugins: all calls to grafana.com
reporting_enabled = false
check_for_updates = false
check_for_plugin_updates = false
feedback_links_enabled = false

[news]
# the news feed is fetched from grafana.com
news_feed_enabled = false

[dashboards]
# Grafana's own home dashboard has a news panel that fetches grafana.com's blog feed from the browser
default_home_dashboard_path = {os.path.join(REPO, "deploy", "grafana", "home.json")}

[snapshots]
# "Publish to snapshots.raintank.io"
external_enabled = false

[plugins]
# no plugin installs at startup, no catalogue, no signing key download: core plugins only
preinstall_disabled = true
plugin_admin_enabled = false
public_key_retrieval_disabled = true

[cloud_migration]
enabled = false

[log]
# to stdout: the supervisor (or the test harness) writes it to the component's log file
mode = console
"""


def render(
    workdir,
    port,
    data_dir,
    datasource_url,
    password_file,
    listen="127.0.0.1",
    scrape_interval=None,
    tls=None,
    datasource_auth=None,
    root_url=None,
    prometheus_url=None,
):
    """Write workdir/grafana.ini and workdir/grafana-provisioning/ (deploy/grafana/provisioning as
    shipped, pointed at datasource_url and at dashboards/); True if any of them changed (Grafana
    reads them only at start). tls: (cert, key) to serve https; datasource_auth: (user,
    password_file, ca_file or None), the basic auth (and the CA) of a datasource with auth on.
    root_url: where readers reach Grafana (Stack.external_url); prometheus_url: where they reach
    the stack's Prometheus, which serves the dashboard's documentation (provisioned_dashboards)."""
    os.makedirs(os.path.join(data_dir, "plugins"), exist_ok=True)
    secret(password_file)
    secret_key_file = os.path.join(os.path.dirname(password_file), "grafana-secret-key")
    secret(secret_key_file)
    prov = os.path.join(workdir, "grafana-provisioning")
    for kind in (
        "plugins",
        "alerting",
        "datasources",
        "dashboards",
    ):  # Grafana logs an error when one is missing
        os.makedirs(os.path.join(prov, kind), exist_ok=True)
    changed = False
    datasources = []
    for kind in ("datasources", "dashboards"):
        for name in sorted(os.listdir(os.path.join(PROVISIONING, kind))):
            with open(os.path.join(PROVISIONING, kind, name)) as f:
                config = yaml.safe_load(f)
            for ds in config.get("datasources", []):
                datasources.append((ds["type"], ds["uid"]))
                ds["url"] = datasource_url
                if scrape_interval:
                    ds["jsonData"]["timeInterval"] = scrape_interval
                if datasource_auth:
                    _add_auth(ds, *datasource_auth)
            for provider in config.get("providers", []):
                provider["options"]["path"] = provisioned_dashboards(
                    os.path.join(workdir, "grafana-dashboards"), datasources, prometheus_url
                )
            # private: the datasource may hold a password
            changed |= write_yaml(
                os.path.join(prov, kind, name),
                config,
                f"blockstack_deploy/grafana.py from deploy/grafana/provisioning/{kind}/{name}",
                private=True,
            )
    path = os.path.join(workdir, "grafana.ini")
    return (
        write_if_changed(
            path,
            ini(port, data_dir, prov, password_file, listen, tls, secret_key_file, root_url),
            private=True,
        )
        or changed
    )


def provisioned_dashboards(dest, datasources, prometheus_url=None):
    """dashboards/*.json copied into dest with their datasource inputs (__inputs, e.g. ${DS_PROMETHEUS})
    resolved to the provisioned datasource of that type [(type, uid)], as an import resolves them: file
    provisioning resolves none, and a dashboard whose $datasource is left on ${DS_PROMETHEUS} queries
    whichever datasource is the default. With prometheus_url, the documentation link of the default
    docs_url knob ({{ $externalURL }}/user/dashboard.html, the Go template Prometheus expands in
    the alerts' runbook_url) points at that Prometheus, which serves docs/html/ at /user/.
    Returns dest (the provider's path)."""
    os.makedirs(dest, exist_ok=True)
    uids = dict(datasources)
    for name in sorted(os.listdir(DASHBOARDS)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(DASHBOARDS, name)) as f:
            text = f.read()
        for i in json.loads(text).get("__inputs", []):
            if i.get("type") == "datasource" and i.get("pluginId") in uids:
                text = text.replace("${%s}" % i["name"], uids[i["pluginId"]])
        if prometheus_url:
            text = text.replace("{{ $externalURL }}", prometheus_url)
        write_if_changed(os.path.join(dest, name), text)
    return dest


def _add_auth(ds, user, password_file, ca_file):
    """Basic auth on a datasource (secureJsonData: Grafana stores it encrypted) and, for https, the
    CA that signed the datasource's certificate. The password is a reference Grafana expands when
    it provisions ($__file{}), not a copy: the provisioning file holds no secret."""
    ds["secureJsonData"] = {"basicAuthPassword": f"$__file{{{password_file}}}"}
    ds.update(basicAuth=True, basicAuthUser=user)
    if ca_file:
        ds.setdefault("jsonData", {})["tlsAuthWithCACert"] = True
        with open(ca_file) as f:
            ds["secureJsonData"]["tlsCACert"] = f.read()


def command(binary, home, ini_path, port, scheme="http", host="127.0.0.1"):
    """(argv, env, health_url) for the supervisor or procs.running."""
    argv = [binary] + (["server"] if os.path.basename(binary) == "grafana" else [])
    argv += [f"--homepath={home}", f"--config={ini_path}"]
    env = (
        {}
        if os.path.isdir("/usr/share/zoneinfo")
        else {"ZONEINFO": os.path.join(home, "tools", "zoneinfo.zip")}
    )
    return argv, env, f"{scheme}://{host}:{port}/api/health"


def main():
    found = find()
    if not found:
        print(HINT, file=sys.stderr)
        return 1
    print(f">> grafana: {found[0]} (home {found[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
