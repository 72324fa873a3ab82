"""Hypothesis strategies for invalid and hostile MOTJ specs, each with the field it breaks.

The leaves come from the CRD's own openAPIV3Schema (crds/), so a new field is fuzzed without an edit
here. Every generated case is invalid by construction and carries the field path the rejection must
name (`spec.training.globalBatchSize`, `metadata.name`, ...). Categories (issue 8 §3): wrong types,
huge numbers, negative sizes, odd unicode, missing problem, conflicting pins, very long lists and
strings, unknown fields, and values the schema admits but Kubernetes refuses in the children.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

import yaml
from hypothesis import strategies as st

from memfit_testbed.paths import REPO

CRD = REPO / "crds" / "memfit.dev_memoryoptimizedtrainingjobs.yaml"
QUICKSTART: dict[str, Any] = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
MAX_JOB_NAME = 40  # memfit.kube.names.MAX_JOB_NAME: room for the children's suffixes


@dataclass(frozen=True)
class Leaf:
    """One field of the spec schema."""

    path: tuple[str, ...]  # keys under spec
    schema: dict[str, Any]

    @property
    def dotted(self) -> str:
        return "spec." + ".".join(self.path)


@dataclass(frozen=True)
class Case:
    """A hostile MOTJ and the field its rejection must name."""

    category: str
    field: str
    doc: dict[str, Any]

    def describe(self) -> str:
        return f"{self.category} {self.field}: {json.dumps(self.doc.get('spec'), default=str)[:300]}"


def _leaves(schema: dict[str, Any], path: tuple[str, ...] = ()) -> list[Leaf]:
    out: list[Leaf] = []
    if schema.get("type") == "object" and "properties" in schema:
        for key, child in schema["properties"].items():
            out += _leaves(child, (*path, key))
    elif path:
        out.append(Leaf(path, schema))
    return out


def spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    return dict(version["schema"]["openAPIV3Schema"]["properties"]["spec"])


LEAVES = [leaf for leaf in _leaves(spec_schema()) if leaf.path[0] != "problem" or leaf.path[1] == "builtin"]
INTEGERS = [leaf for leaf in LEAVES if leaf.schema.get("type") == "integer"]
NUMBERS = [leaf for leaf in LEAVES if leaf.schema.get("type") == "number"]
ENUMS = [leaf for leaf in LEAVES if "enum" in leaf.schema]
PATTERNED = [leaf for leaf in LEAVES if "pattern" in leaf.schema] + [
    Leaf(("placement", "nodePools", "0"), {"pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}),
    Leaf(("problem", "entrypoint"), {"pattern": r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", "maxLength": 256}),
]
STRINGS = [leaf for leaf in LEAVES if leaf.schema.get("type") == "string" and "maxLength" in leaf.schema]
BUILTIN = QUICKSTART["spec"]["problem"]["builtin"]


def _base(name: str) -> dict[str, Any]:
    doc = copy.deepcopy(QUICKSTART)
    doc["metadata"] = {"name": name}
    doc["spec"]["placement"]["nodePools"] = ["t4-spot", "l4-ondemand"]
    return doc


def _put(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set spec.<path> (a digit key indexes a list), creating objects on the way."""
    node: Any = doc["spec"]
    for key, nxt in itertools.pairwise(path):
        if key.isdigit():
            node = node[int(key)]
            continue
        if key not in node or not isinstance(node[key], dict | list):
            node[key] = [] if nxt.isdigit() else {}
        node = node[key]
    last = path[-1]
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    if path[:2] == ("problem", "entrypoint"):
        doc["spec"]["problem"].pop("builtin", None)


def _field(path: tuple[str, ...]) -> str:
    out = "spec"
    for key in path:
        out += f"[{key}]" if key.isdigit() else f".{key}"
    return out


names = st.from_regex(r"\A[a-z][a-z0-9]{2,12}\Z")
letters = st.text(alphabet=st.characters(categories=("Ll", "Lu")), min_size=1, max_size=12)
# Odd unicode: right-to-left marks, zero-width joiners, emoji, combining marks, CJK, NUL-free controls.
odd_text = st.text(
    alphabet=st.one_of(
        st.sampled_from(
            "\u202e\u200d\u200b\ufeff\u0301\u00e9\u00df\u4e2d\u6587\U0001f680\U0001f4a5 \t\n/:*?<>|\"'\\"
        ),
        st.characters(categories=("Lo", "Mn", "So", "Zs", "Cf")),
    ),
    min_size=1,
    max_size=40,
).filter(lambda s: s.strip() != "" and s.strip() not in ("auto",))


@st.composite
def wrong_type(draw: st.DrawFn, name: str) -> Case:
    leaf = draw(st.sampled_from(LEAVES))
    kind = leaf.schema.get("type")
    if kind in ("integer", "number"):
        value = draw(
            st.one_of(letters, st.lists(st.integers(), max_size=3), st.just({"x": 1}), st.booleans())
        )
    elif kind == "boolean":
        value = draw(st.one_of(letters, st.integers(), st.lists(st.booleans(), max_size=2)))
    elif kind == "array":
        value = draw(st.one_of(letters, st.integers(), st.just({"pool": "a"})))
    elif leaf.schema.get("x-kubernetes-int-or-string"):
        value = draw(
            st.one_of(st.lists(st.integers(), min_size=1, max_size=3), st.just({"stage": 1}), st.booleans())
        )
    else:  # string or enum
        value = draw(
            st.one_of(st.integers(), st.lists(letters, max_size=2), st.just({"k": "v"}), st.booleans())
        )
    doc = _base(name)
    _put(doc, leaf.path, value)
    return Case("wrong type", _field(leaf.path), doc)


@st.composite
def huge_number(draw: st.DrawFn, name: str) -> Case:
    leaf = draw(st.sampled_from(INTEGERS + NUMBERS))
    high = leaf.schema.get("maximum", 10**9)
    if leaf.schema.get("type") == "integer":
        value: Any = draw(
            st.one_of(st.integers(high + 1, 2**62), st.just(2**63 - 1), st.integers(10**19, 10**30))
        )
    else:
        value = draw(st.floats(min_value=float(high) * 1.5 + 1, max_value=1e300, allow_infinity=False))
    doc = _base(name)
    _put(doc, leaf.path, value)
    return Case("huge number", _field(leaf.path), doc)


@st.composite
def negative_size(draw: st.DrawFn, name: str) -> Case:
    leaf = draw(st.sampled_from(INTEGERS + NUMBERS))
    low = leaf.schema.get("minimum", 0)
    if leaf.schema.get("type") == "integer":
        value: Any = draw(st.integers(-(2**40), min(low - 1, -1)))
    else:
        value = draw(st.floats(min_value=-1e12, max_value=-1e-9))
    doc = _base(name)
    _put(doc, leaf.path, value)
    return Case("negative size", _field(leaf.path), doc)


@st.composite
def odd_unicode(draw: st.DrawFn, name: str) -> Case:
    leaf = draw(st.sampled_from(ENUMS + PATTERNED))
    text = draw(odd_text)
    if "enum" in leaf.schema and text in leaf.schema["enum"]:
        text += "\u200b"
    pattern = leaf.schema.get("pattern")
    if pattern and re.search(pattern, text):
        text = "\u202e" + text
    doc = _base(name)
    _put(doc, leaf.path, text)
    return Case("odd unicode", _field(leaf.path), doc)


@st.composite
def odd_name(draw: st.DrawFn, name: str) -> Case:
    """metadata.name: not a DNS subdomain (API server), or longer than memfit's 40 (operator)."""
    doc = _base(name)
    bad = draw(
        st.one_of(
            odd_text.map(lambda t: name + t),
            st.integers(MAX_JOB_NAME + 1 - len(name), 200).map(lambda n: name + "x" * n),
        )
    )
    doc["metadata"]["name"] = bad
    return Case(
        "odd unicode" if len(bad) <= MAX_JOB_NAME or not bad.isascii() else "very long", "metadata.name", doc
    )


@st.composite
def missing_problem(draw: st.DrawFn, name: str) -> Case:
    doc = _base(name)
    how = draw(st.sampled_from(["absent", "empty", "two sources", "null"]))
    if how == "absent":
        del doc["spec"]["problem"]
    elif how == "empty":
        doc["spec"]["problem"] = {}
    elif how == "null":
        doc["spec"]["problem"] = None
    else:
        doc["spec"]["problem"] = {"builtin": dict(BUILTIN), "entrypoint": "pkg.train:problem"}
    return Case("missing problem", "spec.problem", doc)


CONFLICTS: dict[str, tuple[dict[str, Any], str]] = {
    "ddp shards": ({"strategy": {"engine": "ddp", "zeroStage": 3}}, "spec.strategy.zeroStage"),
    "ddp offloads": ({"strategy": {"engine": "ddp", "offload": "cpu"}}, "spec.strategy.offload"),
    "fsdp nvme": ({"strategy": {"engine": "fsdp", "offload": "nvme"}}, "spec.strategy.offload"),
    "micro-batch does not divide": (
        {"training": {"globalBatchSize": 10}, "strategy": {"microBatchSize": 4}},
        "spec.strategy.microBatchSize",
    ),
    "heads do not divide hidden": (
        {"problem": {"builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 3}}},
        "spec.problem.builtin.heads",
    ),
    "patch does not divide image": (
        {"problem": {"builtin": {"kind": "vit", "layers": 2, "hidden": 64, "heads": 4, "imageSize": 100}}},
        "spec.problem.builtin.patchSize",
    ),
    "zero stage 7": ({"strategy": {"zeroStage": 7}}, "spec.strategy.zeroStage"),
    "zero stage word": ({"strategy": {"zeroStage": "max"}}, "spec.strategy.zeroStage"),
    "micro-batch 0": ({"strategy": {"microBatchSize": 0}}, "spec.strategy.microBatchSize"),
    # Fine-tune rules CEL refuses at admission (memfit.api.finetune_rules).
    "model path leaves the volume": (
        {"problem": {"huggingface": {"volumeClaim": "models", "path": "../etc"}}},
        "spec.problem.huggingface.path",
    ),
    "hub token with a volume model": (
        {"problem": {"huggingface": {"volumeClaim": "models", "path": "m", "tokenSecretRef": {"name": "hub"}}}},
        "spec.problem.huggingface.tokenSecretRef",
    ),
    "absolute output path": ({"output": {"volumeClaim": "out", "path": "/etc"}}, "spec.output.path"),
    "dataset for a builtin model": (
        {"data": {"files": {"volumeClaim": "corpus", "path": "train.jsonl"}}}, "spec.data"
    ),
}


def conflict_case(name: str, key: str) -> Case:
    """The CONFLICTS case `key` on the base job `name`."""
    patch, field = CONFLICTS[key]
    doc = _base(name)
    for section, values in copy.deepcopy(patch).items():
        if section == "problem":
            doc["spec"]["problem"] = values
        else:
            doc["spec"].setdefault(section, {}).update(values)
    return Case("conflicting pins", field, doc)


@st.composite
def conflicting_pins(draw: st.DrawFn, name: str) -> Case:
    key = draw(st.sampled_from(sorted(CONFLICTS)))
    case = conflict_case(name, key)
    doc = case.doc
    if key == "micro-batch does not divide":
        global_batch = draw(st.integers(5, 1000).filter(lambda g: g % 4 != 0))
        doc["spec"]["training"]["globalBatchSize"] = global_batch
    return case


@st.composite
def very_long(draw: st.DrawFn, name: str) -> Case:
    doc = _base(name)
    if draw(st.booleans()):
        n = draw(st.integers(33, 2000))
        doc["spec"]["placement"]["nodePools"] = [f"pool-{i}" for i in range(n)]
        return Case("very long list", "spec.placement.nodePools", doc)
    leaf = draw(st.sampled_from(STRINGS))
    limit = int(leaf.schema["maxLength"])
    text = "a" * draw(st.integers(limit + 1, limit + 5000))
    if leaf.path == ("problem", "builtin", "kind") or "enum" in leaf.schema:
        text = "gpt" + text
    _put(doc, leaf.path, text)
    return Case("very long string", _field(leaf.path), doc)


@st.composite
def unknown_field(draw: st.DrawFn, name: str) -> Case:
    doc = _base(name)
    section = draw(
        st.sampled_from(["training", "strategy", "placement", "objective", "recovery", "scheduling"])
    )
    key = draw(st.one_of(names, odd_text)).strip() or "x"
    doc["spec"].setdefault(section, {})[key + "Typo"] = draw(st.integers(0, 9))
    return Case("unknown field", f"spec.{section}", doc)


# Values the CRD schema admits but Kubernetes refuses in the Job or Pod memfit would create.
CHILD_FIELDS: dict[str, tuple[tuple[str, ...], st.SearchStrategy[str]]] = {
    "spec.image": (("image",), st.sampled_from([" trainer:1", "trainer:1 ", "\ttrainer", "trainer\n"])),
    "spec.scheduling.kueueQueue": (("scheduling", "kueueQueue"), odd_text.map(lambda t: "q" + t)),
    "spec.scheduling.priorityClassName": (
        ("scheduling", "priorityClassName"),
        st.one_of(
            odd_text.map(lambda t: "p" + t), st.sampled_from(["High_Priority", "UPPER", "-lead", "a..b"])
        ),
    ),
    "spec.training.checkpoint.volumeClaim": (
        ("training", "checkpoint", "volumeClaim"),
        st.one_of(odd_text.map(lambda t: "c" + t), st.sampled_from(["My_Claim", "claim!", "Claim"])),
    ),
}


@st.composite
def child_refused(draw: st.DrawFn, name: str) -> Case:
    field = draw(st.sampled_from(sorted(CHILD_FIELDS)))
    path, values = CHILD_FIELDS[field]
    doc = _base(name)
    _put(doc, path, draw(values))
    return Case("admitted, refused in children", field, doc)


CATEGORIES = {
    "wrong type": wrong_type,
    "huge number": huge_number,
    "negative size": negative_size,
    "odd unicode": odd_unicode,
    "odd name": odd_name,
    "missing problem": missing_problem,
    "conflicting pins": conflicting_pins,
    "very long": very_long,
    "unknown field": unknown_field,
    "admitted, refused in children": child_refused,
}


def hostile_case(name: str) -> st.SearchStrategy[Case]:
    """Any category, with `name` as the job name (unless the case is about the name)."""
    return st.one_of(*(make(name) for make in CATEGORIES.values()))
