"""ebpf_exporter's counters as the doctor reads them (--ebpf): its exposition text, by device
(named from the `devno` label) and operation, and by block cgroup."""

import re


def read_ebpf(url, names, timeout=10):
    """Counters of ebpf_exporter by (what, device[, operation]): requests issued and their bytes,
    refused merges, splits, jbd2 credit waits, their seconds and those that found the journal
    full; and by (what, device, operation, cgroup) the bytes each block cgroup submitted
    (cgroup_bytes) and its refused merges plus split-off pieces (cgroup_collapse), the cgroup
    named by block_cgroup_admissions_total (cgroup_label). Its series carry the device number
    (`devno`, ebpf-configs/README.md); `names` ({devno: device}, the Host's numbers, as
    blockstack_device_number_info publishes them) names them."""
    import urllib.request  # only here: its import is a tenth of the doctor's start on a busy host

    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode("utf-8", "replace")
    return parse_ebpf(text, names)


EBPF_COUNTERS = {
    "ebpf_exporter_block_rq_size_bytes_count": "issued",
    "ebpf_exporter_block_rq_size_bytes_sum": "issued_bytes",
    "ebpf_exporter_block_rq_missed_merges_total": "missed_merges",
    "ebpf_exporter_block_bio_splits_total": "splits",
    "ebpf_exporter_jbd2_credit_wait_seconds_count": "jbd2_credit_wait",
    "ebpf_exporter_jbd2_credit_wait_seconds_sum": "jbd2_credit_wait_seconds",
    "ebpf_exporter_jbd2_checkpoint_waits_total": "jbd2_checkpoint_waits",
    # per block cgroup (ebpf-configs/block_cgroups.bpf.h), summed as the rules' ebpf_block_cgroup_*
    "ebpf_exporter_block_cgroup_bio_bytes_total": "cgroup_bytes",
    "ebpf_exporter_block_cgroup_missed_merges_total": "cgroup_collapse",
    "ebpf_exporter_block_cgroup_splits_total": "cgroup_collapse",
}
CGROUP_ADMISSIONS = "ebpf_exporter_block_cgroup_admissions_total"
# A container's scope as the rules' `cgroup` label shows it: "docker-<64 hex>.scope" is
# "docker <first 12 hex>" (alerts/src/recording.rules.yml.in, ebpf_block_cgroup_*).
_CONTAINER_SCOPE = re.compile(
    r"(docker|cri-containerd|crio|libpod)-([0-9a-f]{12})[0-9a-f]*\.scope", re.ASCII
)


def cgroup_label(name):
    """A cgroup's directory name as the dashboard and the page show it."""
    m = _CONTAINER_SCOPE.fullmatch(name)
    return f"{m[1]} {m[2]}" if m else name


def parse_ebpf(text, names):
    """read_ebpf's counters from ebpf_exporter's exposition text."""
    from prometheus_client.parser import text_string_to_metric_families

    out, by_cgroup, named = {}, [], {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            device = names.get(s.labels.get("devno"))
            if not device:
                continue
            cgroup_id = s.labels.get("cgroup_id")
            if s.name == CGROUP_ADMISSIONS:
                named[(device, cgroup_id)] = cgroup_label(s.labels.get("cgroup", ""))
            elif what := EBPF_COUNTERS.get(s.name):
                key = (what, device, s.labels.get("operation", ""))
                if cgroup_id is None:
                    out[key] = out.get(key, 0.0) + s.value
                else:
                    by_cgroup.append((key, cgroup_id, s.value))
    for (what, device, op), cgroup_id, value in by_cgroup:
        # the admissions and the counters are read from different maps: a cgroup admitted in
        # between has counts before its name
        name = named.get((device, cgroup_id)) or (
            "other" if cgroup_id == "0" else f"cgroup id {cgroup_id}"
        )
        key = (what, device, op, name)
        out[key] = out.get(key, 0.0) + value
    return out
