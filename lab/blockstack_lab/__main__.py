"""python -m blockstack_lab: see blockstack_lab.cli."""

import sys

from .cli import main

sys.exit(main())
