"""`memfit-trainer fetch`: the download step. A training pod's init container downloads the hub model
and the hub dataset of its Plan once into HF_HOME on the job's checkpoint volume (the dataset is
prepared by `datasets` there, train and eval splits); the trainer then loads both with the hub off
(HF_HUB_OFFLINE), so a re-planned attempt or a replaced pod reads the same files without downloading
again, and a hub that is down or a token that is refused fails here, with a message naming the field.

The hub is whatever HF_ENDPOINT names (a mirror, or the hub itself); the token comes from HF_TOKEN
(`problem.huggingface.tokenSecretRef`) and is never printed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from memfit.api import pod as contract
from memfit.api.plan import Plan

from memfit_trainer.file_access import FileAccessError, require_folder
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
# Without the weights: config.json, the tokenizer's files, chat templates, remote code.
CONFIG_FILES = ["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken", "*.py"]
MARKER = ".memfit-fetched"  # in HF_HOME: what node 0 of a shared cache downloaded (the others wait for it)
WAIT_SECONDS = 6 * 3600.0  # a node waiting for node 0's download gives up after this long


class FetchError(Exception):
    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def hub_model(plan: Plan) -> tuple[str, str | None, str] | None:
    """(model id, revision, `weights` or `config`) when the trainer needs files of a hub model (its
    weights; or its config.json and tokenizer), else None."""
    hf = plan.problem.huggingface if plan.problem is not None else None
    if hf is None or hf.model is None:
        return None
    what = hf.hub_files(tokenizer=plan.data is not None and plan.data.real)
    return (hf.model, hf.revision, what) if what else None


def fetch(plan: Plan, environ: Mapping[str, str]) -> Path | None:
    """Download what the trainer needs of the Plan's hub model into the hub cache (HF_HOME); the snapshot
    folder, or None when nothing is on the hub. Files already in the cache are not downloaded again;
    `*.bin` weights are skipped when the repository has safetensors (what from_pretrained loads)."""
    found = hub_model(plan)
    if found is None:
        return None
    model, revision, what = found
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    token = environ.get(contract.ENV_HF_TOKEN) or None
    try:
        if what == "config":
            folder = snapshot_download(model, revision=revision, token=token, allow_patterns=CONFIG_FILES)
        else:
            files = HfApi().list_repo_files(model, revision=revision, token=token)
            safetensors = any(f.endswith(".safetensors") for f in files)
            ignored = IGNORED + (["*.bin", "*.pth", "*.pt"] if safetensors else [])
            folder = snapshot_download(model, revision=revision, token=token, ignore_patterns=ignored)
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
    except Exception as error:  # connection errors of the HTTP client, a full disk: retryable
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

    token = environ.get(contract.ENV_HF_TOKEN) or None
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
        except Exception as error:  # connection errors of the HTTP client, a full disk: retryable
            raise FetchError(Reason.TRAINING_ERROR, f"spec.data.huggingface.name: could not download "
                             f"{hub.name!r} from {constants.ENDPOINT}: {_first_line(error)}") from error  # fmt: skip
    return [split for _, split in splits]


def _marker_text(plan: Plan) -> str:
    hf = plan.problem.huggingface if plan.problem is not None else None
    hub = plan.data.huggingface if plan.data is not None else None
    return json.dumps({"model": hf.model if hf else None, "revision": hf.revision if hf else None,
                       "dataset": hub.model_dump(mode="json") if hub else None,
                       "evalSplit": plan.data.eval_split if plan.data else None}, sort_keys=True)  # fmt: skip


def _marker(environ: Mapping[str, str]) -> Path:
    from huggingface_hub import constants

    return Path(environ.get(contract.ENV_HF_HOME) or constants.HF_HOME) / MARKER


def _require_cache(plan: Plan, environ: Mapping[str, str]) -> None:
    """InvalidPlan when this process may not use the hub cache (HF_HOME on the checkpoint volume): node 0
    writes there, the other nodes of a shared cache read. No retry of the pod would help."""
    if hub_model(plan) is None and (plan.data is None or plan.data.huggingface is None):
        return
    try:
        require_folder(_marker(environ).parent, role="the hub cache (HF_HOME)", write=not _waits_for_node0(environ))
    except FileAccessError as error:
        raise FetchError(Reason.INVALID_PLAN, str(error)) from error


def _waits_for_node0(environ: Mapping[str, str]) -> bool:
    return environ.get(contract.ENV_FETCH_SHARED) == "1" and environ.get(contract.ENV_NODE_RANK, "0") not in ("", "0")


def _write_marker(plan: Plan, environ: Mapping[str, str]) -> None:
    marker = _marker(environ)
    marker.parent.mkdir(parents=True, exist_ok=True)
    partial = marker.with_suffix(".partial")
    partial.write_text(_marker_text(plan), encoding="utf-8")
    partial.replace(marker)  # atomic: a waiting node never reads half a marker


def _wait_for_marker(plan: Plan, environ: Mapping[str, str], poll: float = 2.0) -> int:
    """Another node of a shared cache: wait until node 0 wrote the marker for this Plan's model and data."""
    marker, wanted = _marker(environ), _marker_text(plan)
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if marker.exists() and marker.read_text(encoding="utf-8") == wanted:
            print(f"memfit-trainer fetch: node 0 downloaded into {marker.parent}")
            return 0
        time.sleep(poll)
    raise FetchError(Reason.TRAINING_ERROR, f"node 0's download into {marker.parent} did not finish in "
                     f"{WAIT_SECONDS:.0f}s")  # fmt: skip


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
        _require_cache(plan, environ)
        if _waits_for_node0(environ):
            return _wait_for_marker(plan, environ)
        folder = fetch(plan, environ)
        splits = fetch_dataset(plan, environ)
        _write_marker(plan, environ)
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
