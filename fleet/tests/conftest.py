import os
import sys

# `import fleet` (the repository root) and the dashboard helpers (dashboards/).
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
for path in (REPO, os.path.join(REPO, "dashboards")):
    if path not in sys.path:
        sys.path.insert(0, path)
