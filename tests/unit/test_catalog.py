"""GPU catalog: complete, consistent, and resolvable by key or GFD product label."""

from __future__ import annotations

import pytest
from memfit.catalog import CATALOG, find_gpu

REQUIRED = {
    "t4": 15360,
    "l4": 23034,
    "a10g": 23028,
    "l40s": 46068,
    "a100-40": 40960,
    "a100-80": 81920,
    "h100-80": 81559,
    "h200": 143771,
}


@pytest.mark.parametrize(("key", "usable_mib"), REQUIRED.items(), ids=REQUIRED.keys())
def test_required_gpu_present_with_usable_memory(key: str, usable_mib: int) -> None:
    gpu = find_gpu(key)
    assert gpu is not None and gpu.usable_mib == usable_mib
    assert gpu.price_per_gpu_hour > 0 and gpu.price_source
    assert gpu.hbm_gbps > 0 and gpu.fp32_tflops > 0


@pytest.mark.parametrize(
    ("label", "key"),
    [("Tesla-T4", "t4"), ("NVIDIA-A100-SXM4-80GB", "a100-80"), ("nvidia-l4", "l4"), ("NVIDIA-H200", "h200")],
)
def test_lookup_by_gfd_product(label: str, key: str) -> None:
    gpu = find_gpu(label)
    assert gpu is not None and gpu.key == key


def test_t4_has_no_bf16_and_ampere_does() -> None:
    assert not find_gpu("t4").supports_bf16  # type: ignore[union-attr]
    assert all(g.supports_bf16 == (g.architecture not in ("volta", "turing")) for g in CATALOG)


def test_keys_unique_and_unknown_is_none() -> None:
    assert len({g.key for g in CATALOG}) == len(CATALOG)
    assert find_gpu("tpu-v5") is None
