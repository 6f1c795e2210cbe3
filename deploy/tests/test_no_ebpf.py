"""A kernel where no BPF program set loads (before 5.10, or without BTF): `make up` starts the rest
of the stack and says so, instead of starting nothing. The stack neither starts nor scrapes
ebpf_exporter, blockstack-exporter publishes select-configs.sh's status (the alert
BlockStackCollapseEvidenceMissing reads it), and the summary warns that no collapse can page."""

import os

import pytest
import yaml

from blockstack_deploy import roles

BLIND = (
    "block\t-\tblock_io: no kernel BTF; libbpf: failed to find valid kernel BTF; "
    "block_io_immediate: no kernel BTF; libbpf: failed to find valid kernel BTF\njbd2\t-\t\n"
)


def standalone(tmp_path, configs, status):
    role = roles.Standalone(str(tmp_path), ebpf_configs=configs)
    os.makedirs(os.path.dirname(role.stack.ebpf_status_file), exist_ok=True)
    with open(role.stack.ebpf_status_file, "w") as f:
        f.write(status)
    role.render()
    return role


def test_nothing_loads_the_rest_runs_and_says_so(tmp_path):
    role = standalone(tmp_path, "", BLIND)
    cmds = role.commands()
    assert "ebpf" not in cmds and {
        "node",
        "blockstack",
        "prometheus",
        "alertmanager",
        "receiver",
    } <= set(cmds)
    assert not any(
        "9435" in a for argv, _, _ in cmds.values() for a in argv
    )  # no route to it on the front
    blockstack = cmds["blockstack"][0]
    assert f"--collector.ebpf.status-file={role.stack.ebpf_status_file}" in blockstack
    with open(os.path.join(role.config, "prometheus.yml")) as f:
        jobs = [j["job_name"] for j in yaml.safe_load(f)["scrape_configs"]]
    assert "ebpf" not in jobs and "blockstack" in jobs
    summary = "\n".join(role.summary(1.0))
    assert (
        "WARNING: no block BPF programs load on this kernel (the collapse page cannot fire on this host): "
        "block_io: no kernel BTF" in summary
    ), summary
    assert "WARNING: no jbd2 BPF programs load" in summary
    assert "ebpf_exporter  not started" in summary and "http://127.0.0.1:9435" not in summary


@pytest.mark.built  # the ebpf command names ebpf_exporter (make ebpf-build)
def test_part_loads_ebpf_runs_what_loads(tmp_path):
    role = standalone(
        tmp_path, "block_io_immediate", "block\tblock_io_immediate\tblock_io: bpf_loop\njbd2\t-\t\n"
    )
    cmds = role.commands()
    assert "--config.names=block_io_immediate" in cmds["ebpf"][0]
    summary = "\n".join(role.summary(1.0))
    assert "WARNING: no jbd2 BPF programs load on this kernel: " in summary
    assert "collapse page cannot fire" not in summary and "http://127.0.0.1:9435/metrics" in summary
