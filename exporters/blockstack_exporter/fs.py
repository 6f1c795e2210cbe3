"""Small, fast readers for sysfs/procfs files.

sysfs attributes are read with one os.read each: at 1024 devices the exporter reads more
than ten thousand of them per scrape, and the plain open() path costs several times more.
"""
import os
import resource


class ParseError(ValueError):
    """A file held something other than what the kernel documents for it."""


def read_text(path):
    """The stripped content of a small file (sysfs attributes are at most one page)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


def read_int(path):
    text = read_text(path)
    try:
        return int(text)
    except ValueError:
        raise ParseError(f"{path}: expected an integer, got {text[:40]!r}") from None


def listdir(path):
    """Names in a directory, or [] if it does not exist (a device vanished, a feature absent)."""
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


class AttributeReader:
    """Reads sysfs attributes through descriptors kept open from one scrape to the next.

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
        self.capacity = max(0, soft // 2 - 256)  # leave room for sockets and the other collectors
        self.fds = {}
        self.used = set()

    def read_text(self, path):
        fd = self.fds.get(path)
        if fd is not None:
            try:
                data = os.pread(fd, 65536, 0)
                self.used.add(path)
                return data.decode("utf-8", "replace").strip()
            except OSError:
                del self.fds[path]
                os.close(fd)
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, 65536, 0)
        except OSError:
            os.close(fd)
            raise
        if len(self.fds) < self.capacity:
            self.fds[path] = fd
            self.used.add(path)
        else:
            os.close(fd)
        return data.decode("utf-8", "replace").strip()

    def sweep(self):
        """Close the descriptors not read since the last sweep (their devices are gone)."""
        for path in set(self.fds) - self.used:
            os.close(self.fds.pop(path))
        self.used = set()

    def close(self):
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
