"""Writing the rendered configuration: only what changed, secrets 0600."""

import os
import secrets

import yaml


def write_private(path, text):
    """Write text to path readable by its owner only (0600, also when the file existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def write_if_changed(path, text, private=False):
    """Write text to path unless it is already there; True if the file changed."""
    try:
        with open(path) as f:
            if f.read() == text:
                return False
    except FileNotFoundError:
        pass
    if private:
        write_private(path, text)
    else:
        with open(path, "w") as f:
            f.write(text)
    return True


def write_yaml(path, config, source, private=False):
    """config as YAML under a header naming the module that rendered it; True if the file changed."""
    header = f"# rendered by {source}: edit the source, not this file\n"
    return write_if_changed(path, header + yaml.safe_dump(config, sort_keys=False), private=private)


def secret(path):
    """A generated password kept 0600 at path; the same one on every run."""
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_private(path, secrets.token_urlsafe(18) + "\n")
    with open(path) as f:
        return f.read().strip()
