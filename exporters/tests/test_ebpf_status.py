"""The ebpf collector and the doctor on select-configs.sh's status file: which sets of BPF programs
load on the kernel, and a host whose kernel loads no block programs (no collapse can page there)
said so as a metric, in the doctor's report and in its exit status; bad files are counted errors."""

import json
import subprocess

from exporter_testlib import HOST_LOOP, Scraped, registry_for, tree_flags
from test_doctor import DOCTOR, NO_LVM_CONF

# Debian 11's 5.10 in the VM lab: block_io needs bpf_loop() (5.17), the jbd2 fexit variant BTF for modules
LOADS = (
    "block\tblock_io_immediate\tblock_io: libbpf: prog 'flush_pending': BPF program load failed: Invalid argument\n"
    "jbd2\tjbd2_credit_wait_legacy\tjbd2_credit_wait_fexit: libbpf: prog 'add_transaction_credits_entry': "
    "failed to find kernel BTF type ID of 'add_transaction_credits': -3; jbd2_credit_wait: "
    'Failed to attach program "ext4_journal_start_sb" for config "jbd2_credit_wait": no such file or directory\n'
)
BLIND = (
    "block\t-\tblock_io: no kernel BTF; libbpf: failed to find valid kernel BTF; block_io_immediate: no kernel "
    "BTF; libbpf: failed to find valid kernel BTF\njbd2\t-\t\n"
)


def scrape(tmp_path, text):
    status = tmp_path / "ebpf-status.tsv"
    status.write_text(text)
    return Scraped(registry_for(HOST_LOOP, f"--collector.ebpf.status-file={status}"))


def test_sets_that_load_and_the_variants_that_do_not(tmp_path):
    s = scrape(tmp_path, LOADS)
    assert s.get("blockstack_ebpf_set_loaded", set="block", config="block_io_immediate") == 1
    assert s.get("blockstack_ebpf_set_loaded", set="jbd2", config="jbd2_credit_wait_legacy") == 1
    failed = s.series("blockstack_ebpf_variant_failed_info")
    assert {(x["set"], x["config"]) for x in failed} == {
        ("block", "block_io"),
        ("jbd2", "jbd2_credit_wait_fexit"),
        ("jbd2", "jbd2_credit_wait"),
    }
    assert any("flush_pending" in x["error"] for x in failed)


def test_a_kernel_that_loads_nothing(tmp_path):
    s = scrape(tmp_path, BLIND)
    assert s.get("blockstack_ebpf_set_loaded", set="block", config="") == 0
    assert s.get("blockstack_ebpf_set_loaded", set="jbd2", config="") == 0
    assert s.success("ebpf") == 1


def test_bad_and_missing_status_files_are_counted_not_fatal(tmp_path):
    for name, text in (("garbled", "block block_io\n"), ("binary", "\x00\xff\tx\n")):
        (tmp_path / name).mkdir()
        s = scrape(tmp_path / name, text)
        assert s.series("blockstack_ebpf_set_loaded") == [], name
        assert s.errors("ebpf", "parse") >= 1, name
        assert s.success("ebpf") == 1, name
    s = Scraped(registry_for(HOST_LOOP, f"--collector.ebpf.status-file={tmp_path}/absent.tsv"))
    assert s.errors("ebpf", "vanished") >= 1
    assert s.success("ebpf") == 1


def doctor(tmp_path, text, *flags):
    status = tmp_path / "ebpf-status.tsv"
    status.write_text(text)
    argv = [a for a in tree_flags(HOST_LOOP) if not a.startswith("--collector.ebpf.status-file=")]
    r = subprocess.run(
        [
            DOCTOR,
            *argv,
            f"--path.lvmconf={NO_LVM_CONF}",
            f"--collector.ebpf.status-file={status}",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r.returncode, r.stdout


def test_doctor_warns_where_no_collapse_can_page(tmp_path):
    rc, out = doctor(tmp_path, BLIND)
    assert rc == 1, out
    assert out.startswith(
        "WARNING ebpf_evidence_missing: no block BPF programs load on this kernel: "
        "no merge collapse can page on this host\n"
    ), out
    assert "WARNING ebpf_evidence_missing: no jbd2 BPF programs load" in out
    assert "failed to find valid kernel BTF" in out and "--btf.path" in out


def test_doctor_names_the_variants_a_kernel_runs(tmp_path):
    rc, out = doctor(tmp_path, LOADS, "--json")
    report = json.loads(out)
    assert report["ebpf_sets"]["block"]["config"] == "block_io_immediate"
    assert "flush_pending" in report["ebpf_sets"]["block"]["errors"]["block_io"]
    assert not [
        line
        for line in doctor(tmp_path, LOADS)[1].splitlines()
        if "WARNING ebpf_evidence_missing" in line
    ]


def test_doctor_exit_2_on_an_unreadable_status_file(tmp_path):
    rc, out = doctor(tmp_path, "nonsense\n")
    assert rc == 2 and "problem: --collector.ebpf.status-file" in out, out
