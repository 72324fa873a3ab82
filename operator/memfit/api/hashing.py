"""Problem hash: the key under which the operator caches profiles and the profiler labels them."""

from __future__ import annotations

import hashlib
import json

from memfit.api.problem import Problem, problem_config

# 16 hex digits = 64 bits: collisions need ~4e9 distinct problems in one cache (birthday bound).
HASH_HEX_DIGITS = 16


def canonical_problem_json(problem: Problem) -> str:
    """The problem's wire form as canonical JSON: sorted keys, no whitespace, no None fields."""
    return json.dumps(problem_config(problem), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def problem_hash(problem: Problem) -> str:
    """First 16 hex digits of the SHA-256 of the canonical problem JSON.

    Equal for problems that differ only in key order or in explicitly written defaults (the wire form
    fills defaults in), different for any change to the model, data shape or entrypoint.
    """
    digest = hashlib.sha256(canonical_problem_json(problem).encode("utf-8")).hexdigest()
    return digest[:HASH_HEX_DIGITS]


def profile_cache_key(
    problem: Problem, *, optimizer: str, optimizer8bit: str, image: str, gpu_product: str, depth: str = "full",
    peft: str = "",
    script: str = "",
) -> str:
    """The profile cache key: the problem and everything else a profile's numbers depend on.

    A profile measures the problem with the job's optimizer (its state and step scratch) and 8-bit
    choice (`auto`/`on`/`off`; `off` skips the bitsandbytes points), in the trainer image (torch and
    library versions change what is allocated), on one GPU product, and -- for a job that allows
    LoRA/QLoRA, whose adapters the profile measures too -- the adapter settings (`peft`, empty for other
    jobs, which keeps their keys). Jobs that differ in any of them must not share a profile. `depth` is
    `full` (the whole model measured: the key of older profiles, unchanged), `reduced` (1 and 2 of its
    blocks measured) or `analytic` (nothing measured). `script`: a job whose own container is probed names it
(memfit.lifecycle.probe_points.script_key): its measured peaks are that script's. 16 hex digits of SHA-256, like `problem_hash`.
    """
    key = {
        "problem": problem_config(problem),
        "optimizer": optimizer,
        "optimizer8bit": optimizer8bit,
        "image": image,
        "gpuProduct": gpu_product,
    }
    if depth != "full":
        key["depth"] = depth
    if peft:
        key["peft"] = peft
    if script:  # a probed spec.container: the script's own peaks are stored with the profile
        key["script"] = script
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_HEX_DIGITS]
