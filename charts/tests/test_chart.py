"""The Helm chart: its version is the repository's, every value is documented, `helm lint` is
clean, and `helm template` renders manifests that kubeconform validates, strictly, against the
OpenAPI schemas of each Kubernetes version of K8S_SCHEMA_VERSIONS (the Makefile) and the Prometheus
Operator's CRDs (`make k8s-schemas`). The rendered pod keeps its least privilege: the tests below
read it from `helm template`, not from values.yaml.
"""

import os
import re
import subprocess

import podkit
import pytest
import yaml

VALUES = os.path.join(podkit.CHART, "values.yaml")
README = os.path.join(podkit.CHART, "README.md")
EVERYTHING = [
    "nodeExporter.enabled=true",
    "dm.enabled=true",
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "dashboard.enabled=true",
]
VARIANTS = {
    "defaults": [],
    "everything": EVERYTHING,
    "podmonitor": ["podMonitor.enabled=true", "prometheusRule.enabled=true"],
    "no-ebpf": ["ebpf.enabled=false", "serviceMonitor.enabled=true"],
    "no-hostpath": ["blockstack.hostProc=false", "seccomp.install=false"],
}


def schema_versions():
    with open(os.path.join(podkit.REPO, "Makefile")) as f:
        return re.search(r"^K8S_SCHEMA_VERSIONS\s*:=\s*(.+)$", f.read(), re.M).group(1).split()


def test_chart_version_is_the_repositorys():
    with open(os.path.join(podkit.CHART, "Chart.yaml")) as f:
        chart = yaml.safe_load(f)
    assert chart["version"] == chart["appVersion"] == podkit.version()


def test_every_value_is_documented():
    """Each key of values.yaml (to the second level) is named in the chart's README table."""
    with open(VALUES) as f:
        values = yaml.safe_load(f)
    with open(README) as f:
        readme = f.read()
    keys = []
    for key, value in values.items():
        keys.append(key)
        if isinstance(value, dict) and key not in (
            "nodeSelector",
            "podSecurityContext",
            "updateStrategy",
        ):
            keys += [f"{key}.{sub}" for sub in value]
    missing = [k for k in keys if f"`{k}`" not in readme]
    assert not missing, f"values not in {README}: {missing}"


# --- helm and kubeconform (make helm, make k8s-schemas) --------------------------------------


@pytest.fixture(scope="module")
def built():
    missing = [p for p in (podkit.HELM, podkit.KUBECONFORM) if not os.path.exists(p)]
    missing += [
        d
        for v in schema_versions()
        for d in [os.path.join(podkit.SCHEMAS, f"v{v}-standalone-strict")]
        if not os.path.isdir(d)
    ]
    if missing:
        pytest.fail(f"not built (run `make helm k8s-schemas`): {', '.join(missing)}")
    if not os.path.exists(os.path.join(podkit.CHART, "files", "mixin", "prometheus-rule.yaml")):
        pytest.fail("the chart has no files/mixin/ (run `make chart`)")


@pytest.mark.built
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint(built, variant):
    args = ["lint", "--strict", podkit.CHART, "--kube-version", schema_versions()[-1]]
    for v in VARIANTS[variant]:
        args += ["--set", v]
    r = podkit.helm(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[WARNING]" not in r.stdout and "[ERROR]" not in r.stdout, r.stdout


def kubeconform(manifests, version):
    locations = [
        os.path.join(
            podkit.SCHEMAS,
            "{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}",
            "{{ .ResourceKind }}{{ .KindSuffix }}.json",
        ),
        os.path.join(podkit.SCHEMAS, "crds", "{{ .ResourceKind }}{{ .KindSuffix }}.json"),
    ]
    args = [podkit.KUBECONFORM, "-strict", "-summary", "-kubernetes-version", version]
    for location in locations:
        args += ["-schema-location", location]
    return subprocess.run(
        args, input=manifests, capture_output=True, text=True, timeout=120, check=False
    )


def template(values, version):
    args = ["template", "t", podkit.CHART, "--kube-version", version]
    for v in values:
        args += ["--set", v]
    r = podkit.helm(*args)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.built
@pytest.mark.parametrize("version", schema_versions())
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_manifests_validate(built, variant, version):
    r = kubeconform(template(VARIANTS[variant], version), version)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"Invalid: 0, Errors: 0, Skipped: 0$", r.stdout.strip()), r.stdout


@pytest.mark.built
def test_a_misspelt_field_fails_validation(built):
    """The schemas are strict: a field the API does not have is an error (so the test above can
    fail), in a built-in kind and in a CRD."""
    version = schema_versions()[-1]
    manifests = template(EVERYTHING, version)
    for good, bad in [
        ("readOnlyRootFilesystem:", "readOnlyRootFileSystem:"),
        ("scrapeTimeout:", "scrapeTimout:"),
    ]:
        assert good in manifests
        r = kubeconform(manifests.replace(good, bad, 1), version)
        assert r.returncode != 0 and bad.rstrip(":") in r.stdout, r.stdout


@pytest.mark.built
def test_pod_least_privilege(built):
    """The rendered pod: ebpf-exporter adds CAP_BPF and CAP_PERFMON to nothing, under the chart's
    Localhost profile, read-only, no host namespace; two hostPaths, the profile's directory (the
    init container's) and the host's /proc read-only (blockstack-exporter's); the other
    containers add nothing and run as nobody."""
    docs = podkit.render(EVERYTHING)
    spec = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert not any(spec.get(k) for k in ("hostPID", "hostNetwork", "hostIPC"))
    containers = {c["name"]: c for c in spec["containers"] + spec["initContainers"]}
    assert host_path_mounts(spec) == {
        (
            "install-seccomp-profile",
            "/var/lib/kubelet/seccomp/blockstack-merges",
            "/seccomp",
        ): False,
        ("blockstack-exporter", "/proc", "/host/proc"): True,
    }
    assert "--path.procfs=/host/proc" in containers["blockstack-exporter"]["args"]
    ebpf = containers["ebpf-exporter"]["securityContext"]
    assert ebpf["capabilities"] == {"drop": ["ALL"], "add": ["BPF", "PERFMON"]}
    assert ebpf["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "blockstack-merges/ebpf-exporter.json",
    }
    assert ebpf["readOnlyRootFilesystem"] and ebpf["allowPrivilegeEscalation"] is False
    for name in ("blockstack-exporter", "node-exporter"):
        ctx = containers[name]["securityContext"]
        assert ctx["capabilities"] == {"drop": ["ALL"]} and ctx["runAsUser"] == 65534, name
        assert ctx["readOnlyRootFilesystem"] and ctx["allowPrivilegeEscalation"] is False, name
    privileged = [n for n, c in containers.items() if c["securityContext"].get("privileged")]
    assert privileged == ["dm-helper"]
    assert "dm-helper" not in {
        c["name"]
        for c in next(d for d in podkit.render([]) if d["kind"] == "DaemonSet")["spec"]["template"][
            "spec"
        ]["containers"]
    }, "the dm helper is privileged: never on by default"


def host_path_mounts(spec):
    """{(container, host path, mountPath): readOnly} of every hostPath volume's mounts."""
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    return {
        (c["name"], paths[m["name"]], m["mountPath"]): m.get("readOnly", False)
        for c in spec.get("initContainers", []) + spec["containers"]
        for m in c.get("volumeMounts", [])
        if m["name"] in paths
    }


@pytest.mark.built
def test_host_proc_can_be_left_out(built):
    """blockstack.hostProc=false: no /proc of the host, and blockstack-exporter reads its own;
    with seccomp.install=false as well, no hostPath at all."""
    for values, want in [
        (["blockstack.hostProc=false"], {"/var/lib/kubelet/seccomp/blockstack-merges"}),
        (["blockstack.hostProc=false", "seccomp.install=false"], set()),
        (["seccomp.install=false"], {"/proc"}),
    ]:
        docs = podkit.render(values)
        spec = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
        assert {path for _, path, _ in host_path_mounts(spec)} == want, values
        exporter = next(c for c in spec["containers"] if c["name"] == "blockstack-exporter")
        assert ("--path.procfs=/host/proc" in exporter["args"]) == ("/proc" in want), values


@pytest.mark.built
def test_rules_and_dashboard_come_from_the_mixin(built):
    """The PrometheusRule is the mixin's (make mixin) without the pager group, selecting the
    cluster's node_exporter job unless the chart runs its own; the targets get the jobs and the
    `host` label the rules join on."""
    with open(os.path.join(podkit.CHART, "files", "mixin", "prometheus-rule.yaml")) as f:
        mixin = yaml.safe_load(f)
    own = {d["kind"]: d for d in podkit.render(EVERYTHING)}
    existing = {d["kind"]: d for d in podkit.render(["prometheusRule.enabled=true"])}
    names = [g["name"] for g in mixin["spec"]["groups"] if g["name"] != "blockstack-pager"]
    assert [g["name"] for g in own["PrometheusRule"]["spec"]["groups"]] == names
    own_text = yaml.safe_dump(own["PrometheusRule"]["spec"])
    existing_text = yaml.safe_dump(existing["PrometheusRule"]["spec"])
    assert 'job="node"' in own_text and 'job="node-exporter"' not in own_text
    assert 'job="node-exporter"' in existing_text and 'job="node"' not in existing_text
    endpoints = own["ServiceMonitor"]["spec"]["endpoints"]
    jobs = {
        e["port"]: [r for r in e["relabelings"] if r["targetLabel"] == "job"] for e in endpoints
    }
    assert {p: j[0]["replacement"] for p, j in jobs.items()} == {
        "ebpf": "ebpf",
        "blockstack": "blockstack",
        "node": "node",
    }
    for e in endpoints:
        assert {
            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "host",
        } in e["relabelings"]
    with open(os.path.join(podkit.CHART, "files", "mixin", "block-stack-merges.json")) as f:
        dashboard = f.read()
    cms = [
        d
        for d in podkit.render(["dashboard.enabled=true", "nodeExporter.enabled=true"])
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    ]
    assert cms[0]["data"]["block-stack-merges.json"] == dashboard.rstrip("\n")
