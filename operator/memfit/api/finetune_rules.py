"""Cross-field rules of a fine-tune over the wire-form spec: the model source of `problem.huggingface`,
`spec.data` and the paths on volume claims, each violation with its field path and what is allowed (run by
`memfit.api.rules.check_spec`).

The messages are shared with the CRD's CEL rules (`memfit.api.crdgen`), so admission and the operator
refuse a spec in the same words; the operator adds what only it can compute (which sources were given).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

Findings = list[tuple[str, str]]

# A path that leaves its volume: absolute, or with a `..` segment. One regex for the operator and the
# CEL rule (`!self.matches(...)`): RE2 and Python's `re` read it the same way.
ESCAPING_PATH = r"^/|(^|/)[.][.](/|$)"
_ESCAPING = re.compile(ESCAPING_PATH)
# Every path on a volume claim (its field path -> an example), checked here and by a CEL rule each.
VOLUME_PATHS = {
    "spec.problem.huggingface.path": "models/llama-3.2-1b",
    "spec.data.files.path": "corpus/train.jsonl",
    "spec.data.evalPath": "corpus/eval.jsonl",
    "spec.output.path": "out/llama-3.2-1b-ft",
}

TOKEN_WITH_VOLUME = ("tokenSecretRef is for hub downloads and is refused with volumeClaim: the weights come "
                     "from the volume (remove tokenSecretRef, or remove volumeClaim and path to load from the hub)")
REVISION_WITH_VOLUME = ("revision is a hub revision and is refused with volumeClaim: the weights come from the "
                        "volume (remove revision, or remove volumeClaim and path to load from the hub)")
EVAL_SPLIT_NEEDS_HUB = "evalSplit is a split of a hub dataset (data.huggingface); for files use evalPath"
EVAL_PATH_NEEDS_FILES = "evalPath is a file on data.files' volume; for a hub dataset use evalSplit"
EVAL_EVERY_NEEDS_SET = "evalEverySteps above 0 needs an eval set: evalSplit (huggingface) or evalPath (files)"
DATA_NEEDS_HF_MODEL = ("data.huggingface and data.files need problem.huggingface: a dataset is tokenized with "
                       "the model's tokenizer (builtin and entrypoint problems train on their own data; use "
                       "synthetic: true)")


def inside_volume(field_path: str) -> str:
    """What a path of `VOLUME_PATHS` may be, naming the field (`path`, `evalPath`) with an example."""
    name = field_path.rsplit(".", 1)[-1]
    return (f"{name} must be a relative path inside the volume: no leading / and no `..` segment "
            f"(e.g. {VOLUME_PATHS[field_path]})")


def escapes(path: Any) -> bool:
    """The path leaves its volume (absolute, or a `..` segment); a non-string is the schema's to report."""
    return isinstance(path, str) and _ESCAPING.search(path) is not None


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
    if claim is not None and hf.get("tokenSecretRef") is not None:
        found.append((f"{base}.tokenSecretRef", TOKEN_WITH_VOLUME))
    if claim is not None and hf.get("revision") is not None:
        found.append((f"{base}.revision", REVISION_WITH_VOLUME))
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
        found.append((f"{base}.evalSplit", EVAL_SPLIT_NEEDS_HUB))
    if data.get("evalPath") is not None and data.get("files") is None:
        found.append((f"{base}.evalPath", EVAL_PATH_NEEDS_FILES))
    every = data.get("evalEverySteps")
    if isinstance(every, int) and every > 0 and data.get("evalSplit") is None and data.get("evalPath") is None:
        found.append((f"{base}.evalEverySteps", EVAL_EVERY_NEEDS_SET))
    problem = spec.get("problem")
    if sources and sources != ["synthetic"] and isinstance(problem, Mapping) and problem.get("huggingface") is None:
        found.append((base, DATA_NEEDS_HF_MODEL))
    return found


def check_volume_paths(spec: Mapping[str, Any]) -> Findings:
    """Every path on a volume claim (`VOLUME_PATHS`) stays inside its volume."""
    found: Findings = []
    for field_path in VOLUME_PATHS:
        value: Any = spec
        for key in field_path.split(".")[1:]:
            value = value.get(key) if isinstance(value, Mapping) else None
        if escapes(value):
            found.append((field_path, inside_volume(field_path)))
    return found


def check_finetune(spec: Mapping[str, Any]) -> Findings:
    """Every violation of the model source, data and output paths of a job (wire form)."""
    return check_model_source(spec) + check_data(spec) + check_volume_paths(spec)
