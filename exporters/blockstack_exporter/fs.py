"""Small, fast readers for sysfs/procfs files.

sysfs attributes are read with one os.read each: at 1024 devices the exporter reads more
than ten thousand of them per scrape, and the plain open() path costs several times more.
"""
import os


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
