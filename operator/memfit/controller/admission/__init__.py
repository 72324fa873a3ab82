"""The `memfit.dev/memory-fit` AdmissionCheck controller: reads each waiting Workload's snapshot
(`read.py`), lets `lifecycle.admission.decide_workload` answer, and applies the answer with the MOTJ
reconcile's own `apply_writes` (`controller.py`)."""
