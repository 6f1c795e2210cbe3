"""Readers for sysfs/procfs files, bounded in what they read and never blocking on a FIFO.

procfs files are read to end of file: one read of a seq_file returns at most a page, cut at a
line boundary (/proc/self/mountinfo of a host with containers is many pages). A sysfs
attribute is at most a page and one pread at offset 0 returns all of it (kernfs calls show()
again), which AttributeReader uses through descriptors kept open between scrapes.
Every reader stops at a bound and raises TooLarge past it: a file is never read whole into
memory just because it is large. Files are opened O_NONBLOCK, so a FIFO in their place
answers at once (EAGAIN/ESPIPE or nothing) instead of blocking the scrape.
"""

import os
import resource
import threading
import time

MAX_FILE_BYTES = 1 << 20  # a procfs file such as jbd2 info or ext4 options (a few hundred bytes)
MAX_MOUNTINFO_BYTES = 16 << 20  # ~100k mounts
MAX_ATTRIBUTE_BYTES = 65536  # a sysfs attribute is at most one page (4 KiB on x86)
RESERVED_FDS = 2048  # descriptors AttributeReader leaves free
SMALL_READ = 256  # bytes of the first read of an attribute: a number or a scheduler list is shorter
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
U64_MAX = (1 << 64) - 1


class ParseError(ValueError):
    """A file held something other than what the kernel documents for it."""


class TooLarge(ParseError):
    """A file or a command's output is larger than anything the kernel writes there."""


def parse_uint(text, what="value"):
    """A kernel unsigned integer (at most 64 bits, ASCII digits only). Anything else, including
    a number of hundreds of digits that int() would take (and float() then reject), is a
    ParseError."""
    if not (len(text) <= 20 and text.isascii() and text.isdigit()):  # 1 to 20 ASCII digits
        raise ParseError(f"{what}: expected a non-negative integer, got {text[:40]!r}")
    value = int(text)
    if value > U64_MAX:
        raise ParseError(f"{what}: {text[:24]}... is larger than 64 bits")
    return value


def read_bytes(path, limit=MAX_FILE_BYTES):
    """A file's content read to end of file, at most `limit` bytes (TooLarge past them)."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 16, limit + 1 - total))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise TooLarge(f"{path}: larger than {limit} bytes")
    finally:
        os.close(fd)


def read_text(path, limit=MAX_FILE_BYTES):
    """The stripped text of a file (bytes that are not UTF-8 become U+FFFD)."""
    return read_bytes(path, limit).decode("utf-8", "replace").strip()


def listdir(path):
    """Names in a directory, or [] if it does not exist (a device vanished, a feature absent).
    Other errors (EACCES, ELOOP of a symlink loop, ...) are raised for the caller to count."""
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


class AttributeReader:
    """Reads sysfs attributes through descriptors kept open from one scrape to the next (worth
    53 % of a 1024-device scrape's CPU: make bench-exporter --without descriptors).

    A sysfs attribute re-reads its value on every pread at offset 0 (kernfs calls the
    attribute's show() again), so a kept descriptor costs one system call per read instead of
    three. A descriptor of a device that went away fails with ENODEV and is reopened or dropped;
    `sweep()` closes those no longer read. Bounded by the open-files limit; past it, files are
    opened per read as usual. Not thread-safe: the exporter serialises scrapes."""

    def __init__(self):
        try:
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            if hard == resource.RLIM_INFINITY or hard > soft:
                soft = min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        except (ValueError, OSError):
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        # Leave room for the server's connections (at most 1,024, blockstack_http.MAX_CONNECTIONS) and the
        # other collectors' reads. Past the capacity (~66,000 attributes with 10,000 devices) reads
        # cost an open and a close each: scrape time then grows faster than the device count.
        self.capacity = max(0, soft - RESERVED_FDS)
        self.fds = {}
        self.used = set()

    def read_text(self, path):
        """The stripped text of the attribute (bytes that are not UTF-8 become U+FFFD)."""
        return self.read_bytes(path).decode("utf-8", "replace").strip()

    def read_bytes(self, path):
        """The attribute's raw content: callers that keep what they parsed from it compare these
        bytes with the last ones and parse only what changed.

        The first read is small (SMALL_READ): an attribute is a few bytes, and a buffer of
        MAX_ATTRIBUTE_BYTES + 1 for each of thousands of reads per scrape costs more than the
        read. A full small read is read again with the whole bound (a pread at offset 0 returns
        the attribute afresh)."""
        fd = self.fds.get(path)
        if fd is not None:
            try:
                data = os.pread(fd, SMALL_READ, 0)
                if len(data) == SMALL_READ:
                    data = self._bounded(path, os.pread(fd, MAX_ATTRIBUTE_BYTES + 1, 0))
                self.used.add(path)
                return data
            except OSError:
                del self.fds[path]
                os.close(fd)
        fd = os.open(path, _OPEN_FLAGS)
        try:
            data = os.pread(fd, SMALL_READ, 0)
            if len(data) == SMALL_READ:
                data = os.pread(fd, MAX_ATTRIBUTE_BYTES + 1, 0)
        except OSError:
            os.close(fd)
            raise
        if len(self.fds) < self.capacity:
            self.fds[path] = fd
            self.used.add(path)
        else:
            os.close(fd)
        return self._bounded(path, data)

    @staticmethod
    def _bounded(path, data):
        if len(data) > MAX_ATTRIBUTE_BYTES:
            raise TooLarge(f"{path}: larger than {MAX_ATTRIBUTE_BYTES} bytes")
        return data

    def sweep(self):
        """Close the descriptors not read since the last sweep (their devices are gone)."""
        for path in set(self.fds) - self.used:
            os.close(self.fds.pop(path))
        self.used = set()

    def close(self):
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


class _PendingRead:
    def __init__(self, path, size, offset):
        self.path, self.size, self.offset = path, size, offset
        self.started = time.monotonic()
        self.done = threading.Event()
        self.result = self.error = None
        threading.Thread(target=self._run, name=f"read {path}", daemon=True).start()

    def _run(self):
        try:
            fd = os.open(
                self.path, os.O_RDONLY | os.O_CLOEXEC
            )  # may block: a FIFO without a writer
            try:
                self.result = os.pread(
                    fd, self.size, self.offset
                )  # may block: a device that does not answer
            finally:
                os.close(fd)
        except OSError as e:
            self.error = e
        finally:
            self.done.set()


class BlockingReads:
    """preads of files that can block (a device node whose device hangs, a FIFO in its place),
    each in a thread of its own and waited for at most a timeout. A read that has not returned
    is not started again: while it is pending, reads of that path fail at once, so one stuck
    device holds one thread, whatever the number of scrapes."""

    def __init__(self):
        self._pending = {}  # path -> _PendingRead still running after its timeout

    def pread(self, path, size, offset, timeout):
        pending = self._pending.get(path)
        if pending is not None:
            if not pending.done.is_set():
                raise TimeoutError(
                    f"{path}: a read started {time.monotonic() - pending.started:.0f} s ago "
                    "has not returned; skipped"
                )
            del self._pending[path]  # it came back: read afresh
        read = _PendingRead(path, size, offset)
        if not read.done.wait(max(0.0, timeout)):
            self._pending[path] = read
            raise TimeoutError(f"{path}: no answer within {max(0.0, timeout):.2f} s; skipped")
        if read.error is not None:
            raise read.error
        return read.result
