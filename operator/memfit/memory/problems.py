"""Analytic model shapes from a job's problem: builtin gpt/bert/vit and common Hugging Face configs.

Nothing is downloaded: a Hugging Face problem needs its `config` inline. Parameter counts follow the
module layouts of `memfit_trainer.problems` (builtin) and of `transformers` (LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel, BertForMaskedLM, ViTForImageClassification);
tests pin them to the published sizes (GPT-2 124,439,808; Llama-2-7B 6,738,415,616; ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

from memfit.api.problem import (
    TASKS_OF,
    Attention,
    BuiltinProblem,
    HuggingFaceProblem,
    ModelKind,
    Problem,
    Task,
)
from memfit.api.profile import ModelShape

GATED_DECODERS = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_HF = (*GATED_DECODERS, "gpt2", "bert", "vit")


class ShapeError(ValueError):
    """The problem cannot be turned into a model shape; the message names the field."""


def shape_from_problem(problem: Problem | BuiltinProblem | HuggingFaceProblem) -> ModelShape:
    """The analytic ModelShape of a builtin or inline Hugging Face problem.

    Raises ShapeError for an entrypoint (its shape is only known from a profile) or an unsupported
    or incomplete Hugging Face config.
    """
    if isinstance(problem, Problem):
        if problem.builtin is not None:
            return shape_from_builtin(problem.builtin)
        if problem.huggingface is not None:
            return shape_from_huggingface(problem.huggingface)
        if problem.entrypoint is None:
            raise ShapeError("problem: exactly one of builtin, huggingface or entrypoint must be set")
        raise ShapeError(
            f"problem.entrypoint {problem.entrypoint!r}: the model shape of user code is known only "
            "from a profile; profile the job first (or pass --profile)"
        )
    if isinstance(problem, BuiltinProblem):
        return shape_from_builtin(problem)
    return shape_from_huggingface(problem)


def shape_from_builtin(spec: BuiltinProblem) -> ModelShape:
    """Builtin models of memfit_trainer: pre-LN blocks with biased QKV/proj/MLP, SDPA, no dropout."""
    h, f, layers = spec.hidden, spec.ffn, spec.layers
    if h % spec.heads:
        raise ShapeError(f"problem.builtin.heads: {spec.heads} does not divide hidden {h}")
    if spec.kind == ModelKind.VIT and spec.image_size % spec.patch_size:
        raise ShapeError(
            f"problem.builtin.patchSize: {spec.patch_size} does not divide imageSize {spec.image_size}"
        )
    block = 3 * h * h + 3 * h + h * h + h + 2 * h * f + f + h + 4 * h
    if spec.kind == ModelKind.VIT:
        patches = (spec.image_size // spec.patch_size) ** 2
        params = (3 * spec.patch_size**2 * h + h) + h + (patches + 1) * h + layers * block + 2 * h
        params += h * spec.num_classes + spec.num_classes
        return ModelShape(
            family="vision", parameters=params, largest_layer_parameters=max(h * f, 3 * h * h + 3 * h),
            layers=layers, hidden=h, heads=spec.heads, ffn_hidden=f, vocab=0,
            tokens_per_sample=spec.tokens_per_sample,
        )
    v, s = spec.vocab, spec.sequence_length
    # Token and position embeddings, blocks, final LayerNorm, untied head without bias.
    params = v * h + s * h + layers * block + 2 * h + v * h
    return ModelShape(
        family="decoder" if spec.kind == ModelKind.GPT else "encoder",
        parameters=params, largest_layer_parameters=max(v * h, h * f, 3 * h * h + 3 * h),
        layers=layers, hidden=h, heads=spec.heads, ffn_hidden=f, vocab=v, tokens_per_sample=s,
    )


def shape_from_huggingface(spec: HuggingFaceProblem) -> ModelShape:
    """Shape of a Hugging Face problem with an inline config."""
    if spec.config is None:
        raise ShapeError(
            f"problem.huggingface.config: {spec.model!r} has no inline config; memfit does not download. "
            "Paste the model's config.json under config (or profile the job)"
        )
    return shape_from_hf_config(spec.config, sequence_length=spec.sequence_length, attention=spec.attention_kind,
                                task=spec.task_kind)


def shape_from_hf_config(config: Mapping[str, object], *, sequence_length: int, attention: Attention = Attention.SDPA,
                         task: Task = Task.AUTO) -> ModelShape:
    """Shape from a config.json mapping: llama/mistral/qwen2 (gated MLP, GQA, tied embeddings),
    gpt2, bert and vit; with the head `task` asks for (a classifier instead of the LM head) and eager
    attention's materialised scores (`attention` eager)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ShapeError('problem.huggingface.config.model_type: missing (e.g. "llama")')
    allowed = TASKS_OF.get(model_type)
    if allowed is not None and task != Task.AUTO and task not in allowed:
        raise ShapeError(f"problem.huggingface.task: {model_type} has no {task.value} head in transformers "
                         f"(allowed: auto, {', '.join(t.value for t in allowed)})")
    classify = task == Task.SEQUENCE_CLASSIFICATION
    if model_type in GATED_DECODERS:
        shape = _gated_decoder(config, sequence_length, classify=classify)
    elif model_type == "gpt2":
        shape = _gpt2(config, sequence_length, classify=classify)
    elif model_type == "bert":
        shape = _bert(config, sequence_length, classify=classify)
    elif model_type == "vit":
        shape = _vit(config)
    else:
        _unmodelled(model_type)
    if attention == Attention.EAGER:
        shape = shape.model_copy(update={"flash_attention": False})
    return shape


def _labels(config: Mapping[str, object]) -> int:
    """Classes of a classification head: `id2label`'s entries, else `num_labels` (transformers' default 2)."""
    labels_map = config.get("id2label")
    if isinstance(labels_map, Mapping) and labels_map:
        return len(labels_map)
    return _int(config, "num_labels", 2)


def _unmodelled(model_type: str) -> NoReturn:
    raise ShapeError(
        f"problem.huggingface.config.model_type: {model_type!r} is not modelled analytically "
        f"(supported: {', '.join(SUPPORTED_HF)}); profile the job to plan it"
    )


def _int(config: Mapping[str, object], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < 1:
        if value is None:
            raise ShapeError(f"problem.huggingface.config.{key}: missing")
        raise ShapeError(f"problem.huggingface.config.{key}: must be a positive integer, got {value!r}")
    return int(value)


def _flag(config: Mapping[str, object], key: str, default: bool) -> bool:
    value = config.get(key, default)
    return bool(value) if isinstance(value, bool | int) else default


def _prob(config: Mapping[str, object], key: str, default: float) -> float:
    value = config.get(key, default)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _heads(config: Mapping[str, object], hidden: int, key: str, default: int | None = None) -> int:
    heads = _int(config, key, default)
    if "head_dim" not in config and hidden % heads:
        raise ShapeError(f"problem.huggingface.config.{key}: {heads} does not divide hidden size {hidden}")
    return heads


def _gated_decoder(config: Mapping[str, object], seq: int, *, classify: bool = False) -> ModelShape:
    """LlamaForCausalLM and relatives: RMSNorm, Q/K/V/O (GQA), SwiGLU MLP, optional tied head."""
    h = _int(config, "hidden_size")
    layers = _int(config, "num_hidden_layers")
    heads = _heads(config, h, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise ShapeError(
            f"problem.huggingface.config.num_key_value_heads: {kv_heads} does not divide "
            f"num_attention_heads {heads}"
        )
    f = _int(config, "intermediate_size")
    v = _int(config, "vocab_size")
    head_dim = _int(config, "head_dim", h // heads)
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    # Qwen2 always has Q/K/V biases; Llama/Mistral only with attention_bias.
    qkv_bias = config.get("model_type") == "qwen2" or _flag(config, "attention_bias", False)
    attn = h * q_dim + 2 * h * kv_dim + q_dim * h + ((q_dim + 2 * kv_dim) if qkv_bias else 0)
    if config.get("model_type") == "qwen3":
        attn += 2 * head_dim  # q_norm and k_norm
    block = attn + 3 * h * f + 2 * h
    tied = _flag(config, "tie_word_embeddings", False)
    # ...ForSequenceClassification: the bare model and a `score` matrix to the labels (no LM head).
    head = h * _labels(config) if classify else (0 if tied else v * h)
    params = v * h + layers * block + h + head
    return ModelShape(
        family="decoder", parameters=params, largest_layer_parameters=max(v * h, h * f, h * q_dim),
        layers=layers, hidden=h, heads=heads, kv_heads=kv_heads, ffn_hidden=f, vocab=0 if classify else v,
        tokens_per_sample=seq, gated_mlp=True, dropout=_prob(config, "attention_dropout", 0.0) > 0,
        separate_qkv=True,
    )


def _gpt2(config: Mapping[str, object], seq: int, *, classify: bool = False) -> ModelShape:
    """GPT2LMHeadModel: Conv1D with biases, learned positions, head tied to the token embedding."""
    h = _int(config, "n_embd", 768)
    layers = _int(config, "n_layer", 12)
    heads = _heads(config, h, "n_head", 12)
    f = _int(config, "n_inner", 4 * h)
    v = _int(config, "vocab_size", 50257)
    positions = _int(config, "n_positions", 1024)
    if seq > positions:
        raise ShapeError(f"problem.huggingface.sequenceLength: {seq} exceeds n_positions {positions}")
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    params = v * h + positions * h + layers * block + 2 * h + (h * _labels(config) if classify else 0)
    dropout = max(_prob(config, k, 0.1) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")) > 0
    return ModelShape(
        family="decoder", parameters=params, largest_layer_parameters=max(v * h, h * f, 3 * h * h),
        layers=layers, hidden=h, heads=heads, ffn_hidden=f, vocab=0 if classify else v, tokens_per_sample=seq,
        dropout=dropout,
    )


def _bert(config: Mapping[str, object], seq: int, *, classify: bool = False) -> ModelShape:
    """BertForMaskedLM: word/position/type embeddings, post-LN blocks, tied MLM head with a transform;
    BertForSequenceClassification: the pooler (dense on the first token) and a classifier instead."""
    h = _int(config, "hidden_size", 768)
    layers = _int(config, "num_hidden_layers", 12)
    heads = _heads(config, h, "num_attention_heads", 12)
    f = _int(config, "intermediate_size", 4 * h)
    v = _int(config, "vocab_size", 30522)
    positions = _int(config, "max_position_embeddings", 512)
    types = _int(config, "type_vocab_size", 2)
    if seq > positions:
        raise ShapeError(
            f"problem.huggingface.sequenceLength: {seq} exceeds max_position_embeddings {positions}"
        )
    block = (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
    embeddings = (v + positions + types) * h + 2 * h
    head = (h * h + h) + 2 * h + v  # transform dense + LayerNorm + decoder bias (weight tied)
    if classify:
        labels = _labels(config)
        head = (h * h + h) + h * labels + labels  # pooler dense + classifier
    params = embeddings + layers * block + head
    dropout = _prob(config, "hidden_dropout_prob", 0.1) > 0
    return ModelShape(
        family="encoder", parameters=params, largest_layer_parameters=max(v * h, h * f),
        layers=layers, hidden=h, heads=heads, ffn_hidden=f, vocab=0 if classify else v, tokens_per_sample=seq,
        dropout=dropout,
        separate_qkv=True,
    )


def _vit(config: Mapping[str, object]) -> ModelShape:
    """ViTForImageClassification: conv patch embedding, class token, blocks, classifier on the CLS."""
    h = _int(config, "hidden_size", 768)
    layers = _int(config, "num_hidden_layers", 12)
    heads = _heads(config, h, "num_attention_heads", 12)
    f = _int(config, "intermediate_size", 4 * h)
    image, patch = _int(config, "image_size", 224), _int(config, "patch_size", 16)
    channels = _int(config, "num_channels", 3)
    if image % patch:
        raise ShapeError(f"problem.huggingface.config.patch_size: {patch} does not divide image_size {image}")
    classes = _labels(config)
    tokens = (image // patch) ** 2 + 1
    block = (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
    params = h + tokens * h + (channels * patch * patch * h + h) + layers * block + 2 * h + h * classes + classes
    dropout = _prob(config, "hidden_dropout_prob", 0.0) > 0
    return ModelShape(
        family="vision", parameters=params, largest_layer_parameters=max(h * f, 3 * h * h),
        layers=layers, hidden=h, heads=heads, ffn_hidden=f, vocab=0, tokens_per_sample=tokens, dropout=dropout,
        separate_qkv=True,
    )
