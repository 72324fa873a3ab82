"""Cross-field rules of a fine-tune over the wire-form spec: the model source of `problem.huggingface`,
`spec.data` and `spec.output`, each violation with its field path and what is allowed (run by
`memfit.api.rules.check_spec`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Findings = list[tuple[str, str]]


def _escapes(path: Any) -> bool:
    return isinstance(path, str) and ".." in path.split("/")


def check_model_source(spec: Mapping[str, Any]) -> Findings:
    """`problem.huggingface`: a weights source that exists and does not contradict itself."""
    problem = spec.get("problem")
    hf = problem.get("huggingface") if isinstance(problem, Mapping) else None
    if not isinstance(hf, Mapping):
        return []
    base = "spec.problem.huggingface"
    found: Findings = []
    claim, path = hf.get("volumeClaim"), hf.get("path")
    if claim is not None and path is None:
        found.append((f"{base}.path", "volumeClaim needs path: the save_pretrained folder on that volume"))
    if path is not None and claim is None:
        found.append((f"{base}.volumeClaim", "path needs volumeClaim: the PersistentVolumeClaim holding it"))
    if claim is None and hf.get("model") is None:
        found.append((f"{base}.model", "required without volumeClaim: the hub model id (or give volumeClaim "
                      "and path of a save_pretrained folder)"))
    if _escapes(path):
        found.append((f"{base}.path", "must stay inside the volume: no `..` segment"))
    if claim is not None and hf.get("tokenSecretRef") is not None:
        found.append((f"{base}.tokenSecretRef", "is for hub downloads; the weights come from volumeClaim "
                      "(remove tokenSecretRef, or remove volumeClaim and path to load from the hub)"))
    if claim is not None and hf.get("revision") is not None:
        found.append((f"{base}.revision", "is a hub revision; the weights come from volumeClaim"))
    return found


def check_data(spec: Mapping[str, Any]) -> Findings:
    """`spec.data`: one source, one field, an eval set that matches the source."""
    data = spec.get("data")
    if not isinstance(data, Mapping):
        return []
    base = "spec.data"
    found: Findings = []
    sources = [k for k in ("huggingface", "files") if data.get(k) is not None]
    if data.get("synthetic") is True:
        sources.append("synthetic")
    if len(sources) != 1:
        found.append((base, "exactly one of huggingface, files or synthetic: true must be set; got "
                      f"{', '.join(sources) or 'none'}"))
    if data.get("textField") is not None and data.get("messagesField") is not None:
        found.append((f"{base}.messagesField", "set textField or messagesField, not both"))
    if data.get("evalSplit") is not None and data.get("huggingface") is None:
        found.append((f"{base}.evalSplit", "is a split of a hub dataset (data.huggingface); for files use evalPath"))
    if data.get("evalPath") is not None and data.get("files") is None:
        found.append((f"{base}.evalPath", "is a file on data.files' volume; for a hub dataset use evalSplit"))
    every = data.get("evalEverySteps")
    if isinstance(every, int) and every > 0 and data.get("evalSplit") is None and data.get("evalPath") is None:
        found.append((f"{base}.evalEverySteps", "needs an eval set: evalSplit (huggingface) or evalPath (files)"))
    files = data.get("files")
    for key, value in (("files.path", files.get("path") if isinstance(files, Mapping) else None),
                       ("evalPath", data.get("evalPath"))):
        if _escapes(value):
            found.append((f"{base}.{key}", "must stay inside the volume: no `..` segment"))
    problem = spec.get("problem")
    if sources and sources != ["synthetic"] and isinstance(problem, Mapping) and problem.get("huggingface") is None:
        found.append((base, "a dataset is tokenized with the model's tokenizer: it needs problem.huggingface "
                      "(builtin and entrypoint problems train on their own data; use synthetic: true)"))
    return found


def check_output(spec: Mapping[str, Any]) -> Findings:
    """`spec.output.path` stays inside its volume."""
    output = spec.get("output")
    if isinstance(output, Mapping) and _escapes(output.get("path")):
        return [("spec.output.path", "must stay inside the volume: no `..` segment")]
    return []


def check_finetune(spec: Mapping[str, Any]) -> Findings:
    """Every violation of the model source, data and output of a job (wire form)."""
    return check_model_source(spec) + check_data(spec) + check_output(spec)
