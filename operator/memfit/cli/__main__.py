"""`python -m memfit.cli`: the same as the `memfit` console script."""

from __future__ import annotations

import sys

from memfit.cli import main

sys.exit(main())
