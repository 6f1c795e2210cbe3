"""What the tests, the benchmarks and the lab share and production code never runs. Installed
by `make venv` (editable), left out of the Debian package (packaging/build-deb.sh)."""
