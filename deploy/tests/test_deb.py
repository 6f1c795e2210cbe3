"""The Debian packages (`make deb`, packaging/build-deb.sh): built from this checkout into a
temporary directory, lintian clean (no error or warning but the overridden ones, each override
with its reason in packaging/debian/PKG.lintian-overrides), the version the VERSION file's, the
conffiles, maintainer scripts and programs in place, and the stack model run from the unpacked
package (blockstack-merges-setup --print-units) rendering this host's units without Grafana.

`built`: the package carries .build/bin/ebpf_exporter and the BPF objects (make ebpf-build).
Installing it for real (postinst, purge) happens in the VM lab's Debian 12 with systemd.
"""

import os
import re
import shutil
import subprocess

import pytest

from blockstack_deploy import privileges

pytestmark = pytest.mark.built

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VERSION = open(os.path.join(REPO, "VERSION")).read().strip()
PACKAGES = ("blockstack-merges", "blockstack-merges-exporters")


def deb(out, pkg, version=VERSION):
    return os.path.join(out, f"{pkg}_{version}-1_amd64.deb")


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    if not os.access(os.path.join(REPO, ".build", "bin", "ebpf_exporter"), os.X_OK):
        pytest.fail("no .build/bin/ebpf_exporter: run make ebpf-build")
    d = str(tmp_path_factory.mktemp("deb"))
    subprocess.run([os.path.join(REPO, "packaging", "build-deb.sh"), d], check=True, timeout=300)
    return d


def field(path, name):
    return subprocess.run(
        ["dpkg-deb", "-f", path, name], check=True, capture_output=True, text=True
    ).stdout.strip()


def contents(path):
    listing = subprocess.run(
        ["dpkg-deb", "-c", path], check=True, capture_output=True, text=True
    ).stdout
    return {line.split(None, 5)[5].split(" -> ")[0].lstrip(".") for line in listing.splitlines()}


def control_file(path, name, tmp_path):
    d = tmp_path / os.path.basename(path)
    if not d.exists():
        subprocess.run(["dpkg-deb", "-e", path, str(d)], check=True)
    return (d / name).read_text()


def test_both_packages_are_built_with_the_version_file(out):
    for pkg in PACKAGES:
        assert os.path.exists(deb(out, pkg)), sorted(os.listdir(out))
        assert field(deb(out, pkg), "Version") == f"{VERSION}-1"
        assert field(deb(out, pkg), "Package") == pkg
        assert field(deb(out, pkg), "Architecture") == "amd64"
    assert os.path.getsize(deb(out, "blockstack-merges-exporters")) < os.path.getsize(
        deb(out, "blockstack-merges")
    )


def test_version_and_revision_can_be_overridden(tmp_path):
    """`make deb VERSION=0.0.9`: the previous build, for an upgrade test."""
    subprocess.run(
        [os.path.join(REPO, "packaging", "build-deb.sh"), str(tmp_path), "0.0.9", "2"],
        check=True,
        timeout=300,
    )
    assert field(str(tmp_path / "blockstack-merges_0.0.9-2_amd64.deb"), "Version") == "0.0.9-2"
    subprocess.run(["dpkg", "--compare-versions", "0.0.9-2", "lt", f"{VERSION}-1"], check=True)


def test_lintian_has_no_error_and_no_warning_but_the_overridden_ones(out):
    debs = [deb(out, p) for p in PACKAGES]
    r = subprocess.run(
        ["lintian", "--tag-display-limit", "0", *debs], capture_output=True, text=True, timeout=600
    )
    assert not [t for t in r.stdout.splitlines() if re.match(r"^[EW]: ", t)], r.stdout
    assert r.returncode == 0, r.stdout + r.stderr
    # with --show-overrides lintian exits 2 where an overridden error shows: only its list is read
    shown = subprocess.run(
        ["lintian", "--tag-display-limit", "0", "--show-overrides", *debs],
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    overridden = {t.split()[2] for t in shown.splitlines() if t.startswith("O: ")}
    written = set()
    for pkg in PACKAGES:
        with open(os.path.join(REPO, "packaging", "debian", f"{pkg}.lintian-overrides")) as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            if line and not line.startswith("#"):
                written.add(line.split()[1])
                assert lines[i - 1].startswith("#") or lines[i - 1].startswith(f"{pkg}:"), (
                    f"{pkg}: override without a comment saying why: {line}"
                )
    assert overridden == written, "overrides that match nothing: " + " ".join(written - overridden)


def test_dpkg_deb_info_names_dependencies(out):
    info = subprocess.run(
        ["dpkg-deb", "--info", deb(out, "blockstack-merges")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for script in ("postinst", "prerm", "postrm", "conffiles", "md5sums", "control"):
        assert re.search(rf"\b{script}\b", info), info
    depends = field(deb(out, "blockstack-merges"), "Depends")
    for name in (
        "python3",
        "python3-prometheus-client",
        "python3-yaml",
        "python3-bcrypt",
        "prometheus-node-exporter",
        "libc6",
        "libelf1",
    ):
        assert re.search(rf"(^|, ){re.escape(name)}\b", depends), depends
    recommends = field(deb(out, "blockstack-merges"), "Recommends")
    assert "prometheus (" in recommends and "prometheus-alertmanager" in recommends
    assert "grafana" not in depends + recommends
    assert field(deb(out, "blockstack-merges-exporters"), "Conflicts") == "blockstack-merges"
    assert "prometheus (" not in field(deb(out, "blockstack-merges-exporters"), "Recommends")


def test_contents_conffiles_and_maintainer_scripts(out, tmp_path):
    common = {
        "/usr/bin/blockstack-exporter",
        "/usr/bin/blockstack-doctor",
        "/usr/sbin/blockstack-merges-setup",
        "/usr/lib/blockstack-merges/build/bin/ebpf_exporter",
        "/usr/lib/blockstack-merges/build/ebpf-configs/block_io.bpf.o",
        "/usr/lib/blockstack-merges/build/ebpf-configs/block_io.yaml",
        "/usr/lib/blockstack-merges/ebpf-configs/select-configs.sh",
        "/usr/lib/blockstack-merges/python/blockstack_exporter/main.py",
        "/usr/lib/blockstack-merges/python/blockstack_exporter/config.yml",
        "/usr/lib/blockstack-merges/python/blockstack_deploy/systemd.py",
        "/usr/lib/blockstack-merges/python/blockstack_deploy/roles/agent.py",
        "/usr/lib/blockstack-merges/python/blockstack_http.py",
        "/usr/lib/python3/dist-packages/blockstack-merges.pth",
        "/etc/blockstack-merges/blockstack-merges.conf",
    }
    full = {
        "/usr/lib/blockstack-merges/alerts/alerts.rules.yml",
        "/usr/lib/blockstack-merges/alerts/recording.rules.yml",
        "/usr/lib/blockstack-merges/alerts/alertmanager.yml",
        "/etc/blockstack-merges/alertmanager.yml",
        "/usr/lib/blockstack-merges/alerts/receiver/page_receiver.py",
        "/usr/lib/blockstack-merges/alerts/templates/blockstack.tmpl",
        "/usr/share/blockstack-merges/dashboards/block-stack-merges.json",
        "/usr/lib/blockstack-merges/docs/html/runbook.html",  # Prometheus serves it at /user/
    }
    for pkg in PACKAGES:
        files = contents(deb(out, pkg))
        expected = common | (full if pkg == "blockstack-merges" else set())
        assert expected <= files, expected - files
        if pkg != "blockstack-merges":
            assert not full & files
        assert {
            f"/usr/share/doc/{pkg}/copyright",
            f"/usr/share/doc/{pkg}/changelog.Debian.gz",
            f"/usr/share/lintian/overrides/{pkg}",
        } <= files
        assert not [f for f in files if "__pycache__" in f or "/tests/" in f]
        assert not [f for f in files if "testsupport" in f]  # test support stays in the checkout
        # no Grafana: only the stack model's grafana.py, which BLOCKSTACK_GRAFANA=none turns off
        assert [f for f in files if "grafana" in f.lower()] == [
            "/usr/lib/blockstack-merges/python/blockstack_deploy/grafana.py"
        ]
        conffiles = control_file(deb(out, pkg), "conffiles", tmp_path).split()
        assert conffiles == sorted(
            f for f in files if f.startswith("/etc/") and not f.endswith("/")
        )
        postrm = control_file(deb(out, pkg), "postrm", tmp_path)
        for (
            user,
            _,
            _,
        ) in privileges.IDENTITIES.values():  # purge deletes every user postinst may make
            assert user in postrm
        assert (
            privileges.GROUP in postrm
            and "/var/lib/blockstack-merges" in postrm
            and "@" not in postrm
        )
        assert "blockstack-merges-setup" in control_file(deb(out, pkg), "postinst", tmp_path)
        for script in ("postinst", "prerm", "postrm"):
            subprocess.run(
                ["sh", "-n", str(tmp_path / os.path.basename(deb(out, pkg)) / script)], check=True
            )


def unpack(out, pkg, tmp_path):
    """The package's files in a directory, its /etc symbolic link pointed into it."""
    root = tmp_path / pkg
    subprocess.run(["dpkg-deb", "-x", deb(out, pkg), str(root)], check=True)
    link = root / "usr/lib/blockstack-merges/alerts/alertmanager.yml"
    if link.is_symlink():
        assert os.readlink(link) == "/etc/blockstack-merges/alertmanager.yml"
        link.unlink()
        link.symlink_to(root / "etc/blockstack-merges/alertmanager.yml")
    return root


def run_setup(root):
    env = {
        **os.environ,
        "BLOCKSTACK_SETUP_ROOT": str(root),
        "PYTHONPATH": str(root / "usr/lib/blockstack-merges/python"),
    }
    for k in ("BLOCKSTACK_HOME", "BLOCKSTACK_BUILD", "BLOCKSTACK_SERVERS"):
        env.pop(k, None)
    r = subprocess.run(
        ["/usr/bin/python3", str(root / "usr/sbin/blockstack-merges-setup"), "--print-units"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return dict(re.findall(r"^### (\S+)\n(.*?)(?=^### |\Z)", r.stdout, re.S | re.M))


@pytest.mark.skipif(
    not shutil.which("prometheus") or not shutil.which("prometheus-node-exporter"),
    reason="Debian's prometheus and prometheus-node-exporter: make deps",
)
def test_the_unpacked_package_renders_this_hosts_units(out, tmp_path):
    """What postinst installs, from the package's own files on Debian's python3 and its libraries:
    the single-host stack without Grafana; the exporters alone in the exporters' package."""
    units = run_setup(unpack(out, "blockstack-merges", tmp_path))
    assert {
        "blockstack-exporter.service",
        "blockstack-node-exporter.service",
        "blockstack-prometheus.service",
        "blockstack-alertmanager.service",
        "blockstack-page-receiver.service",
    } <= set(units), sorted(units)
    assert not [u for u in units if "grafana" in u]
    assert all(
        unit.count("User=blockstack-") == 1 for unit in units.values() if "[Service]" in unit
    )
    prometheus = units["blockstack-prometheus.service"]
    assert "--web.listen-address=127.0.0.1:9190" in prometheus  # packaged PORTS
    # a page's links: where it listens, and the runbook it serves at /user/ (runbook_url)
    assert "--web.external-url=http://127.0.0.1:9190" in prometheus
    assert "/usr/lib/blockstack-merges/docs/html" in prometheus
    assert "--web.external-url=http://127.0.0.1:9193" in units["blockstack-alertmanager.service"]
    assert "/usr/bin/blockstack-exporter " in units["blockstack-exporter.service"]
    exporters = run_setup(unpack(out, "blockstack-merges-exporters", tmp_path))
    assert {"blockstack-exporter.service", "blockstack-node-exporter.service"} <= set(exporters)
    assert not [u for u in exporters if re.search("prometheus|alertmanager|receiver|grafana", u)], (
        sorted(exporters)
    )


def test_the_unpacked_programs_run_on_debians_python(out, tmp_path):
    """blockstack-exporter and blockstack-doctor as installed: /usr/bin/python3 with Debian's
    python3-prometheus-client and python3-yaml, our packages from /usr/lib/blockstack-merges/python."""
    root = unpack(out, "blockstack-merges-exporters", tmp_path)
    env = {**os.environ, "PYTHONPATH": str(root / "usr/lib/blockstack-merges/python")}
    for prog in ("blockstack-exporter", "blockstack-doctor"):
        r = subprocess.run(
            ["/usr/bin/python3", str(root / "usr/bin" / prog), "--help"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and "usage:" in r.stdout, r.stderr
    assert not list(root.rglob("__pycache__"))
