"""The example scripts of docs/own-code.md build the model their flags name (the own-code benchmark runs them
at other sizes than their defaults)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "own-code"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_plain_loop_builds_the_model_of_its_flags() -> None:
    loop = _load("train_loop")
    layers, hidden, heads, vocab, seq = 3, 32, 2, 100, 16
    model = loop.TinyGPT(layers, hidden, heads, vocab, seq)
    block = 4 * hidden * hidden + 4 * hidden + 2 * hidden * 4 * hidden + 4 * hidden + hidden + 4 * hidden
    expected = vocab * hidden + seq * hidden + layers * block + hidden * vocab + vocab
    assert sum(p.numel() for p in model.parameters()) == expected
    logits = model(torch.randint(0, vocab, (2, seq)))
    assert logits.shape == (2, seq, vocab)


def test_the_trainer_script_feeds_rows_of_its_vocabulary_and_length() -> None:
    pytest.importorskip("transformers")
    corpus = _load("hf_trainer").Corpus(vocab=100, seq=16)
    row = corpus[0]["input_ids"]
    assert row.shape == (16,) and int(row.max()) < 100
