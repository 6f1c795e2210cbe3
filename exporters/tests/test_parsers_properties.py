"""Property-based tests: the parsers accept what the kernel writes and reject anything else
with ParseError only, never another exception."""

import struct

from hypothesis import given
from hypothesis import strategies as st

from blockstack_exporter.collectors.ext4 import parse_options, parse_superblock_journal_bytes
from blockstack_exporter.collectors.jbd2 import PHASES, parse_info
from blockstack_exporter.collectors.queue import parse_scheduler, parse_setting
from blockstack_exporter.collectors.stack import split_lvm_name
from blockstack_exporter.devices import parse_mountinfo
from blockstack_exporter.fs import ParseError

names = st.text(
    alphabet=st.characters(whitelist_categories=("Ll", "Nd"), whitelist_characters="-_+."),
    min_size=1,
    max_size=20,
)


def only_parse_errors(fn, *args):
    try:
        fn(*args)
    except ParseError:
        pass


@given(st.text(max_size=200))
def test_scheduler_never_raises_other_errors(text):
    only_parse_errors(parse_scheduler, text)


@given(
    st.lists(
        st.sampled_from(["none", "mq-deadline", "kyber", "bfq"]),
        min_size=1,
        max_size=4,
        unique=True,
    ),
    st.data(),
)
def test_scheduler_finds_the_bracketed_one(scheds, data):
    active = data.draw(st.sampled_from(scheds))
    text = " ".join(f"[{s}]" if s == active else s for s in scheds)
    assert parse_scheduler(text) == active


@given(st.text(max_size=50), st.sampled_from([1, 1024]))
def test_setting_never_raises_other_errors(text, mult):
    only_parse_errors(parse_setting, text, mult)


@given(st.integers(min_value=0, max_value=2**40))
def test_setting_round_trips_kib(n):
    assert parse_setting(f"{n}\n", 1024) == n * 1024


@given(st.text(max_size=500))
def test_jbd2_info_never_raises_other_errors(text):
    only_parse_errors(parse_info, text)


@given(
    st.integers(0, 10**9),
    st.integers(0, 10**9),
    st.integers(1, 10**6),
    st.lists(st.integers(0, 10**6), min_size=len(PHASES), max_size=len(PHASES)),
    st.integers(0, 10**9),
)
def test_jbd2_info_round_trips(tx, req, maxb, phase_ms, commit_us):
    lines = [f"{tx} transactions ({req} requested), each up to {maxb} blocks", "average: "]
    lines += [f"  {ms}ms {text}" for ms, (text, _) in zip(phase_ms, PHASES)]
    lines += [
        f"  {commit_us}us average transaction commit time",
        "  3 handles per transaction",
        "  4 blocks per transaction",
        "  5 logged blocks per transaction",
    ]
    info = parse_info("\n".join(lines) + "\n")
    assert (info["transactions"], info["requested"], info["max_blocks"]) == (tx, req, maxb)
    assert [info["phases"][label] for _, label in PHASES] == [ms / 1e3 for ms in phase_ms]
    assert info["commit_seconds"] == commit_us / 1e6


@given(st.text(max_size=300))
def test_ext4_options_never_raise(text):
    for option, _value in parse_options(text):
        assert "\n" not in option


@given(names, names, st.sampled_from(["", "real", "cow", "tpool", "tdata", "tmeta"]))
def test_lvm_dm_names_round_trip(vg, lv, layer):
    def esc(s):
        return s.replace("-", "--")

    dm_name = f"{esc(vg)}-{esc(lv)}" + (f"-{layer}" if layer else "")
    decoded = split_lvm_name(dm_name)
    if vg.startswith("-") or vg.endswith("-") or lv.startswith("-") or lv.endswith("-"):
        return  # lvm2 refuses such names; decoding them is ambiguous
    assert decoded == (vg, lv, layer)


def test_lvm_dm_names_from_the_incidents():
    assert split_lvm_name("secvol-tmp_backup1-cow") == ("secvol", "tmp_backup1", "cow")
    assert split_lvm_name("secvol-seclv-real") == ("secvol", "seclv", "real")
    assert split_lvm_name("vg--data-lv--a") == ("vg-data", "lv-a", "")
    assert split_lvm_name("nodash") is None


@given(st.text(max_size=400))
def test_mountinfo_never_raises(text):
    mounts, bad = parse_mountinfo(text)
    assert len(mounts) + bad <= len(text.splitlines())


@given(st.binary(min_size=0, max_size=1100))
def test_superblock_never_raises_other_errors(data):
    only_parse_errors(parse_superblock_journal_bytes, data)


@given(st.integers(0, 2**44))
def test_superblock_journal_size_round_trips(size):
    sb = bytearray(1024)
    struct.pack_into("<H", sb, 0x38, 0xEF53)
    struct.pack_into("<I", sb, 0xE0, 8)
    sb[0xFD] = 1
    struct.pack_into("<II", sb, 0x10C + 15 * 4, size >> 32, size & 0xFFFFFFFF)
    assert parse_superblock_journal_bytes(bytes(sb)) == size
