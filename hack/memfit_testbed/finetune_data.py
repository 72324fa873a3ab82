"""A local "volume" for fine-tune tests: a tiny pretrained Llama with its own trained tokenizer, and JSONL text.

Nothing is downloaded: the tokenizer is trained here with `tokenizers`, the model is `from_config` +
`save_pretrained`, and the text comes from a small seeded grammar (learnable, so eval loss falls).
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

MODEL_CLAIM = "models"
MODEL_PATH = "tiny-llama"
DATA_CLAIM = "data"
SEQUENCE_LENGTH = 32
MAX_POSITIONS = 64
VOCAB = 400  # the model's embedding rows: at least the tokenizer's size (examples/finetune-tiny.yaml)

_SUBJECTS = ["the cat", "a dog", "the bird", "my friend", "the teacher", "a child"]
_VERBS = ["sees", "likes", "follows", "helps", "finds", "calls"]
_OBJECTS = ["the ball", "a red box", "the old tree", "the river", "a small house", "the garden"]


def sentences(count: int, *, seed: int) -> list[str]:
    """`count` short documents of two or three grammatical sentences."""
    rng = random.Random(seed)
    docs = []
    for _ in range(count):
        parts = [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}."
                 for _ in range(rng.randint(2, 3))]
        docs.append(" ".join(parts))
    return docs


def train_tokenizer(corpus: list[str]) -> Any:
    """A small BPE tokenizer trained on the corpus, as a transformers PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}")
    return fast


def make_volumes(root: Path, *, seed: int = 0, tied: bool = False, dtype: str = "float32") -> Path:
    """root/models/tiny-llama (model + tokenizer; input and output embeddings shared when `tied`, as in
    Llama-3.2-1B; weights saved in `dtype`, e.g. bfloat16 as on the hub) and
    root/data/{train,eval,chat,numbers}.jsonl; returns root."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    train, held_out = sentences(160, seed=seed), sentences(24, seed=seed + 1)
    tokenizer = train_tokenizer(train)
    model_dir = root / MODEL_CLAIM / MODEL_PATH
    torch.manual_seed(seed)
    assert len(tokenizer) <= VOCAB, len(tokenizer)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=tied)
    AutoModelForCausalLM.from_config(config).to(getattr(torch, dtype)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = root / DATA_CLAIM
    data.mkdir(parents=True, exist_ok=True)
    _jsonl(data / "train.jsonl", [{"text": t, "id": i} for i, t in enumerate(train)])
    _jsonl(data / "eval.jsonl", [{"text": t} for t in held_out])
    _jsonl(data / "chat.jsonl", [{"messages": [{"role": "user", "content": t}, {"role": "assistant", "content": "ok"}]}
                                 for t in train[:40]])
    _jsonl(data / "numbers.jsonl", [{"text": i} for i in range(10)])
    return root


def write_example_claims(models: Path, corpus: Path, *, seed: int = 0) -> None:
    """What examples/finetune-tiny.yaml reads, written into two claims' folders: `models`/tiny-llama (model
    and tokenizer) and `corpus`/{train,eval}.jsonl; the output goes to `models`/out/ later."""
    with tempfile.TemporaryDirectory() as tmp:
        made = make_volumes(Path(tmp), seed=seed)
        shutil.copytree(made / MODEL_CLAIM / MODEL_PATH, models / MODEL_PATH, dirs_exist_ok=True)
        corpus.mkdir(parents=True, exist_ok=True)
        for name in ("train.jsonl", "eval.jsonl"):
            shutil.copy2(made / DATA_CLAIM / name, corpus / name)
    for path in (models / MODEL_PATH, *sorted((models / MODEL_PATH).rglob("*")), corpus, *corpus.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by the pods' non-root user


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def problem(**extra: Any) -> dict[str, Any]:
    """problem.huggingface loading the tiny Llama from the models volume."""
    return {"huggingface": {"volumeClaim": MODEL_CLAIM, "path": MODEL_PATH, "sequenceLength": SEQUENCE_LENGTH,
                            **extra}}


def data(**extra: Any) -> dict[str, Any]:
    """spec.data: train.jsonl with eval.jsonl as the eval set."""
    return {"files": {"volumeClaim": DATA_CLAIM, "path": "train.jsonl", "format": "jsonl"},
            "evalPath": "eval.jsonl", **extra}


def document_loss(model_dir: Path, docs: list[str]) -> float:
    """Mean next-token loss of a saved model over documents, computed with plain transformers (not the
    trainer's code): what a user would measure after loading the output with from_pretrained."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model.eval()
    losses = []
    with torch.no_grad():
        for doc in docs:
            ids = torch.tensor([tokenizer(doc)["input_ids"] + [tokenizer.eos_token_id]])
            losses.append(float(model(input_ids=ids, labels=ids).loss))
    return sum(losses) / len(losses)
