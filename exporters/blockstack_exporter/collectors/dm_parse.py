"""`dmsetup table` and `dmsetup status` lines parsed: pure functions of text, raising only
ParseError (the dm collector's input; fuzzed and property-tested in tests/test_dm.py).

Formats, from the kernel:
- snapshot / snapshot-merge table (Documentation/admin-guide/device-mapper/snapshot.rst):
      <origin> <COW device> <P|PO|N> <chunksize sectors> [<#feature args> [<arg>]*]
  status (drivers/md/dm-snap.c snapshot_status), one of:
      <sectors_allocated>/<total_sectors> <metadata_sectors>   (metadata absent before 2.6.33)
      Invalid | Merge failed | Overflow | Unknown
  sectors_allocated and total_sectors both include the metadata (dm-snap-persistent.c
  persistent_usage); a transient (N) store reports 0 metadata. A merge is done when
  sectors_allocated == metadata_sectors.
- snapshot-origin table: <origin>; status: empty.
- thin-pool table (Documentation/admin-guide/device-mapper/thin-provisioning.rst):
      <metadata dev> <data dev> <data block size sectors> <low water mark> [<#features> <arg>...]
  status (dm-thin.c pool_status):
      <transaction id> <used meta>/<total meta> <used data>/<total data> <held root|->
      [ro|rw|out_of_data_space] [[no_]discard_passdown|ignore_discard]
      [error|queue]_if_no_space [needs_check|-] [<metadata low watermark>]
  or just `Fail` / `Error`. Metadata blocks are 4 KiB (THIN_METADATA_BLOCK_SIZE); data blocks
  are the table's data block size.
Every other target (linear, thin, raid, crypt, ...) is published as blockstack_dm_target_info only;
its arguments are never logged or exported (a crypt table can carry a key).
"""

import re

from ..fs import ParseError, parse_uint

_LINE = re.compile(
    r"^(\S+?):(?: +(\d+) +(\d+) +(\S+)(?: (.*))?)? *$", re.ASCII
)  # mangled names hold no spaces
_DEVNO = re.compile(r"^\d+:\d+$", re.ASCII)
_MANGLED = re.compile(r"\\x([0-9a-fA-F]{2})")


class Target:
    __slots__ = ("name", "start", "length", "target", "params")

    def __init__(self, name, start, length, target, params):
        self.name, self.start, self.length, self.target, self.params = (
            name,
            start,
            length,
            target,
            params,
        )

    def __repr__(self):
        return f"Target({self.name!r}, {self.start}, {self.length}, {self.target!r})"


def unmangle(name):
    """dmsetup's default --manglename auto prints characters outside its whitelist as \\xNN."""
    if "\\x" not in name:
        return name
    return _MANGLED.sub(lambda m: chr(int(m.group(1), 16)), name)


def parse_line(line):
    """'vg-lv: 0 2097152 linear 8:19 384' -> Target; 'vg-lv:' (no table loaded) -> None target.

    Raises ParseError on anything else. The message never quotes the line: a crypt table line
    may hold a key."""
    m = _LINE.match(line)
    if not m:
        raise ParseError(f"unparseable line ({len(line)} characters)")
    name = unmangle(m.group(1))
    if m.group(2) is None:
        return Target(name, None, None, None, "")
    return Target(
        name,
        parse_uint(m.group(2), "start"),
        parse_uint(m.group(3), "length"),
        m.group(4),
        m.group(5) or "",
    )


def parse_listing(text):
    """All lines of `dmsetup table`/`status` output -> ([Target], [(line number, ParseError)])."""
    targets, errors = [], []
    if text.strip() == "No devices found":
        return targets, errors
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            targets.append(parse_line(line))
        except ParseError as e:
            errors.append((number, e))
    return targets, errors


def _int(word, what):
    return parse_uint(word, what)


def _devno(word, what):
    if not _DEVNO.match(word) or not word.isascii():
        raise ParseError(f"{what}: expected MAJ:MIN, got {word[:40]!r}")
    return word


def _fraction(word, what):
    used, sep, total = word.partition("/")
    if not sep:
        raise ParseError(f"{what}: expected USED/TOTAL, got {word[:40]!r}")
    return _int(used, what), _int(total, what)


def _features(words, target):
    """The optional `<#feature args> [<arg>]*` after a table's four fixed arguments."""
    if len(words) <= 4:
        return []
    count, features = _int(words[4], f"{target} feature count"), words[5:]
    if count != len(features):
        raise ParseError(
            f"{target} table: {count} feature arguments announced, {len(features)} given"
        )
    return features


def parse_snapshot_table(params):
    """-> {origin, cow, persistent ('P'|'PO'|'N'), chunk_sectors, features [..]}."""
    words = params.split()
    if len(words) < 4:
        raise ParseError(f"snapshot table: expected 4 or more arguments, got {len(words)}")
    store = words[2].upper()
    if store not in ("P", "PO", "N"):
        raise ParseError(f"snapshot table: persistence is not P, PO or N: {words[2][:10]!r}")
    return {
        "origin": _devno(words[0], "snapshot origin"),
        "cow": _devno(words[1], "snapshot cow"),
        "persistent": store,
        "chunk_sectors": _int(words[3], "snapshot chunk size"),
        "features": _features(words, "snapshot"),
    }


def parse_snapshot_status(params):
    """-> {state, used_sectors, total_sectors, metadata_sectors}; numbers are None when not reported.

    state is the kernel's word mapped to valid|invalid|overflow|merge_failed ("Unknown", a store
    without a usage function, counts as valid). A newer kernel may append a cause to Invalid."""
    text = params.strip()
    out = {"state": "valid", "used_sectors": None, "total_sectors": None, "metadata_sectors": None}
    if text == "Invalid" or text.startswith("Invalid "):
        out["state"] = "invalid"
    elif text == "Merge failed":
        out["state"] = "merge_failed"
    elif text == "Overflow":
        out["state"] = "overflow"
    elif text == "Unknown":
        pass
    else:
        words = text.split()
        if len(words) not in (1, 2):
            raise ParseError(f"snapshot status: unexpected {text[:60]!r}")
        used, total = _fraction(words[0], "snapshot status")
        out["used_sectors"], out["total_sectors"] = used, total
        if len(words) == 2:
            out["metadata_sectors"] = _int(words[1], "snapshot metadata sectors")
    return out


# dm-crypt's optional parameters that are flags (Documentation/admin-guide/device-mapper/dm-crypt.rst):
# only these words are taken from a crypt table, which also holds the key (never kept or logged).
CRYPT_FLAGS = frozenset(
    (
        "allow_discards",
        "same_cpu_crypt",
        "submit_from_crypt_cpus",
        "no_read_workqueue",
        "no_write_workqueue",
        "iv_large_sectors",
    )
)


def crypt_flags(params):
    """The flags among a crypt table's optional parameters:
    <cipher> <key> <iv_offset> <device path> <offset> [<#opt_params> <opt_params>]."""
    return CRYPT_FLAGS.intersection(params.split()[5:])


def parse_origin_table(params):
    words = params.split()
    if len(words) != 1:
        raise ParseError(f"snapshot-origin table: expected 1 argument, got {len(words)}")
    return _devno(words[0], "snapshot-origin origin")


def parse_thin_pool_table(params):
    """-> {metadata_dev, data_dev, data_block_sectors, low_water_mark, features [..]}."""
    words = params.split()
    if len(words) < 4:
        raise ParseError(f"thin-pool table: expected 4 or more arguments, got {len(words)}")
    block = _int(words[2], "thin-pool data block size")
    if block == 0:
        raise ParseError("thin-pool table: data block size 0")
    return {
        "metadata_dev": _devno(words[0], "thin-pool metadata device"),
        "data_dev": _devno(words[1], "thin-pool data device"),
        "data_block_sectors": block,
        "low_water_mark": _int(words[3], "thin-pool low water mark"),
        "features": _features(words, "thin-pool"),
    }


def parse_thin_pool_status(params):
    """-> {failed: None|'Fail'|'Error', transaction_id, used/total metadata and data blocks,
    held_root, mode, needs_check}. Fields newer kernels added are optional."""
    words = params.split()
    if words in (["Fail"], ["Error"]):
        return {"failed": words[0]}
    if len(words) < 4:
        raise ParseError(f"thin-pool status: expected 4 or more fields, got {len(words)}")
    used_meta, total_meta = _fraction(words[1], "thin-pool metadata blocks")
    used_data, total_data = _fraction(words[2], "thin-pool data blocks")
    out = {
        "failed": None,
        "transaction_id": _int(words[0], "thin-pool transaction id"),
        "used_metadata_blocks": used_meta,
        "total_metadata_blocks": total_meta,
        "used_data_blocks": used_data,
        "total_data_blocks": total_data,
        "held_root": None if words[3] == "-" else _int(words[3], "thin-pool held root"),
        "mode": None,
        "needs_check": False,
    }
    for w in words[4:]:
        if w in ("rw", "ro", "out_of_data_space"):
            out["mode"] = w
        elif w == "needs_check":
            out["needs_check"] = True
    return out
