"""`memfit-trainer fetch`: the download step. A training pod's init container downloads the hub model
and the hub dataset of its Plan once into HF_HOME on the job's checkpoint volume (the dataset is
prepared by `datasets` there, train and eval splits); the trainer then loads both with the hub off
(HF_HUB_OFFLINE), so a re-planned attempt or a replaced pod reads the same files without downloading
again, and a hub that is down or a token that is refused fails here, with a message naming the field.

The hub is whatever HF_ENDPOINT names (a mirror, or the hub itself); the token comes from HF_TOKEN
(`problem.huggingface.tokenSecretRef`) and is never printed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from memfit.api.plan import Plan

from memfit_trainer.termination import (
    Reason,
    TerminationMessage,
    exit_code,
    termination_path,
    write_termination_message,
)

BASE = "spec.problem.huggingface"
# Files from_pretrained never reads for a PyTorch model: other frameworks' weights, originals, exports.
IGNORED = ["*.msgpack", "*.h5", "*.ot", "*.onnx", "*.onnx_data", "*.gguf", "*.tflite", "original/*", "onnx/*"]


class FetchError(Exception):
    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def hub_model(plan: Plan) -> tuple[str, str | None] | None:
    """(model id, revision) when the Plan loads pretrained weights from the hub, else None."""
    hf = plan.problem.huggingface if plan.problem is not None else None
    if hf is None or not hf.hub_weights or hf.model is None:
        return None  # weights from a volume, or random weights from the inline config
    return hf.model, hf.revision


def fetch(plan: Plan, environ: Mapping[str, str]) -> Path | None:
    """Download the Plan's hub model into the hub cache (HF_HOME); the snapshot folder, or None when the
    Plan has nothing on the hub. Files already in the cache are not downloaded again."""
    found = hub_model(plan)
    if found is None:
        return None
    model, revision = found
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    token = environ.get("HF_TOKEN") or None
    hf = plan.problem.huggingface if plan.problem is not None else None
    remote_code = ["*.py"] if hf is not None and hf.trust_remote_code else []
    try:
        folder = snapshot_download(model, revision=revision, token=token,
                                   ignore_patterns=[p for p in IGNORED if p not in remote_code])  # fmt: skip
    except RevisionNotFoundError as error:
        raise FetchError(Reason.INVALID_PLAN, f"{BASE}.revision: {revision!r} is not a revision of {model!r} "
                         f"on {constants.ENDPOINT} ({_first_line(error)})") from error  # fmt: skip
    except (GatedRepoError, RepositoryNotFoundError) as error:
        with_token = "with the token of tokenSecretRef" if token else "without a token (no tokenSecretRef)"
        raise FetchError(Reason.INVALID_PLAN, f"{BASE}.model: {model!r} was refused by {constants.ENDPOINT} "
                         f"{with_token}: no such repository, or it is private or gated and needs "
                         f"{BASE}.tokenSecretRef to a Secret with a token that may read it "
                         f"({_first_line(error)})") from error  # fmt: skip
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        if status in (401, 403):
            raise FetchError(Reason.INVALID_PLAN, f"{BASE}.tokenSecretRef: {constants.ENDPOINT} refused the token "
                             f"for {model!r} (HTTP {status}): give a Secret with a token that may read it "
                             f"({_first_line(error)})") from error  # fmt: skip
        raise FetchError(Reason.TRAINING_ERROR, f"{BASE}.model: could not download {model!r} from "
                         f"{constants.ENDPOINT}: {_first_line(error)}") from error  # fmt: skip
    except (LocalEntryNotFoundError, OSError) as error:
        raise FetchError(Reason.TRAINING_ERROR, f"{BASE}.model: could not download {model!r} from "
                         f"{constants.ENDPOINT}: {_first_line(error)}") from error  # fmt: skip
    return Path(folder)


def fetch_dataset(plan: Plan, environ: Mapping[str, str]) -> list[str]:
    """Download and prepare the Plan's hub dataset (its split and eval split) in the `datasets` cache under
    HF_HOME, as the trainer will load it; the splits fetched ([] when the data is not on the hub)."""
    data = plan.data
    hub = data.huggingface if data is not None else None
    if data is None or hub is None:
        return []
    import datasets
    from datasets.exceptions import DatasetNotFoundError
    from huggingface_hub import constants

    token = environ.get("HF_TOKEN") or None
    splits = [("spec.data.huggingface.split", hub.split)]
    if data.eval_split:
        splits.append(("spec.data.evalSplit", data.eval_split))
    for field, split in splits:
        try:
            datasets.load_dataset(hub.name, hub.config, split=split, revision=hub.revision, token=token)
        except DatasetNotFoundError as error:
            with_token = "with the token of tokenSecretRef" if token else "without a token (no tokenSecretRef)"
            raise FetchError(Reason.INVALID_PLAN, f"spec.data.huggingface.name: {hub.name!r} was refused by "
                             f"{constants.ENDPOINT} {with_token}: no such dataset, or it is private or gated "
                             f"({_first_line(error)})") from error  # fmt: skip
        except ValueError as error:  # an unknown split or config
            raise FetchError(Reason.INVALID_PLAN, f"{field}: {split!r} of {hub.name!r} (config {hub.config!r}): "
                             f"{_first_line(error)}") from error  # fmt: skip
        except (ConnectionError, OSError) as error:
            raise FetchError(Reason.TRAINING_ERROR, f"spec.data.huggingface.name: could not download "
                             f"{hub.name!r} from {constants.ENDPOINT}: {_first_line(error)}") from error  # fmt: skip
    return [split for _, split in splits]


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def main(plan_path: Path, environ: Mapping[str, str] | None = None) -> int:
    """The init container's command; exit codes and the termination message as for `train`."""
    from memfit_trainer.plan_check import InvalidPlanError, load_plan, refuse_invalid

    environ = os.environ if environ is None else environ
    started = time.monotonic()
    try:
        plan = load_plan(plan_path)
    except InvalidPlanError as error:
        return refuse_invalid(error, rank=None, environ=environ)
    try:
        folder = fetch(plan, environ)
        splits = fetch_dataset(plan, environ)
    except FetchError as error:
        print(f"memfit-trainer fetch: {error.reason}: {error}", file=sys.stderr)
        message = TerminationMessage(reason=error.reason, message=str(error)[:1024])
        write_termination_message(message, termination_path(dict(environ)))
        return exit_code(error.reason)
    if folder is None and not splits:
        print("memfit-trainer fetch: nothing to download (the model and data come from volumes or a config)")
    if folder is not None:
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        print(f"memfit-trainer fetch: {size / 2**20:.1f} MiB in {folder} ({time.monotonic() - started:.1f}s)")
    if splits:
        assert plan.data is not None and plan.data.huggingface is not None
        print(f"memfit-trainer fetch: dataset {plan.data.huggingface.name!r} split(s) {', '.join(splits)} prepared")
    return 0
