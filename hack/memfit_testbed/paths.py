"""Where the test bed finds the checkout's files (KWOK configs, examples, CRDs): it runs from the source tree."""

from __future__ import annotations

from pathlib import Path

HACK = Path(__file__).resolve().parents[1]
REPO = HACK.parent
KWOK = HACK / "kwok"
