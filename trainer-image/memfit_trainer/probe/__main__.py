"""`python3 -m memfit_trainer.probe`: the probe's driver from the bundle (memfit_trainer.probe.bundle)."""

import sys

from memfit_trainer.probe.command import main

sys.exit(main())
