"""The chart's pod in a VM-lab guest on Debian 12's 6.1 kernel (blockstack_lab.vm): the kernel a
Debian node runs, with device-mapper and `kernel.perf_event_paranoid=3`. The same pod as
test_podman.py, run by podman in the guest: ebpf_exporter loads the variants this kernel allows
it (block_io, whose flush is a BPF timer, which paranoid 3 does not concern: until 2026-11-27 it was
a CPU-wide perf event and block_io_immediate ran here; jbd2_credit_wait_legacy) and counts nvme0n1's requests; the dm helper keeps CAP_SYS_ADMIN alone and
blockstack-exporter reads a dm table through it.

Marker vm_long (`make test-vm-long`): a boot, the image imported into the guest (~50 s under
TCG), about 3 minutes in all. Needs `make vm-deps`, `make chart-image`, `make helm`.
"""

import contextlib
import glob
import os
import re

import podkit
import pytest
from prometheus_client.parser import text_string_to_metric_families

from blockstack_exporter.collectors.stack import encode_dev
from blockstack_testsupport.clock import wait_until

pytestmark = [pytest.mark.vm, pytest.mark.vm_long, pytest.mark.root, pytest.mark.built]

KERNEL = "6.1"
SYS_ADMIN = f"{1 << 21:016x}"


@pytest.fixture(scope="module")
def guest():
    from blockstack_lab import vm

    problems = vm.missing([KERNEL])
    if problems:
        pytest.fail(f"VM lab not ready (run `make vm-deps`): {'; '.join(problems)}")
    tars = glob.glob(os.path.join(podkit.BUILD, "k8s-image", "*.tar"))
    if not os.path.exists(podkit.HELM) or len(tars) != 1:
        pytest.fail("run `make helm chart-image`")
    with vm.Guest(KERNEL, nvme=1) as g:
        # what a node has loaded: the filesystems' modules (their BTF) and device-mapper
        g.run("modprobe -a ext4 jbd2 dm_mod")
        host = podkit.InGuest(g)
        r = podkit.podman("import", "--quiet", tars[0], podkit.IMAGE, host=host, timeout=600)
        assert r.returncode == 0, r.stderr
        yield g


def samples(text):
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def test_pod_on_debian_6_1(guest):
    values = ["dm.enabled=true", "nodeExporter.enabled=true"]
    with podkit.pod(values, "bsm-vm", host=podkit.InGuest(guest), directory=guest.dir) as p:
        for c in ("ebpf-exporter", "dm-helper", "blockstack-exporter", "node-exporter"):
            p.start(c)
        with contextlib.suppress(TimeoutError):  # select-configs.sh probes each variant under TCG
            wait_until("ebpf-exporter", lambda: "Listening on" in p.logs("ebpf-exporter"), 300, 2)
        assert "Listening on" in p.logs("ebpf-exporter"), p.logs("ebpf-exporter")[-3000:]
        status = p.read("run", "ebpf-status.tsv")
        assert re.search(r"^block\tblock_io\t", status, re.M), status
        # the jbd2 functions and tracepoints are in modules, whose BTF libbpf does not find
        # without CAP_SYS_ADMIN: the raw tracepoint variant, as under the Debian package
        assert re.search(r"^jbd2\tjbd2_credit_wait_legacy\t", status, re.M), status
        ebpf = p.status("ebpf-exporter")
        assert (ebpf["CapBnd"], ebpf["CapEff"]) == (f"{(1 << 39) | (1 << 38):016x}", "0" * 16)

        # nvme0n1's requests counted
        major, minor = (
            int(x, 16) for x in guest.run("stat -c '%t %T' /dev/nvme0n1").stdout.split()
        )
        devno = str(encode_dev(major, minor))

        def requests():
            return sum(
                s.value
                for s in samples(p.http_get(9435, via="blockstack-exporter"))
                if s.name == "ebpf_exporter_block_rq_size_bytes_count"
                and s.labels.get("devno") == devno
                and s.labels.get("operation") == "read"
            )

        before = requests()
        guest.run("dd if=/dev/nvme0n1 of=/dev/null bs=4k count=256 iflag=direct")
        assert requests() - before >= 256

        # a dm table read through the helper, which holds CAP_SYS_ADMIN alone
        helper = p.status("dm-helper")
        assert "CapBnd" in helper, p.logs("dm-helper")
        assert (helper["CapBnd"], helper["CapEff"], helper["NoNewPrivs"]) == (
            SYS_ADMIN,
            SYS_ADMIN,
            "1",
        )
        guest.run("echo '0 8192 linear /dev/nvme0n1 0' | dmsetup create bsmtest")
        try:
            text = p.http_get(9363, via="blockstack-exporter")
        finally:
            guest.run("dmsetup remove bsmtest", check=False)
        dm = [s for s in samples(text) if s.name.startswith("blockstack_dm_")]
        assert any(s.labels.get("target") == "linear" for s in dm), [s.name for s in dm]
        failed = [
            s.labels
            for s in samples(text)
            if s.name == "blockstack_scrape_collector_success" and not s.value
        ]
        assert not failed, failed
