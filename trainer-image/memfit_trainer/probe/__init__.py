"""The probe: profiles a user's own, unchanged training script (spec.container; docs/own-code.md).

- `startup/sitecustomize.py`: loaded by Python in the script's process when the driver prepends `startup/` to
  PYTHONPATH; does nothing unless MEMFIT_PROBE_OUT is set, then installs `hooks`.
- `hooks`: counts optimizer steps and reads memory once per training step, then writes its `records` and ends.
- `driver`: runs the script once per micro-batch and writes one summary (`memfit-trainer probe`).
"""
