"""blockstack-exporter: queue settings, device stacks, dm snapshots, ext4 options and jbd2 stats."""

__version__ = "0.1.0"
