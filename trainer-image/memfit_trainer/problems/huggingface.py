"""Hugging Face models: pretrained weights (`from_pretrained` from a volume or the hub) or random weights
from a config (`AutoConfig.for_model` on the inline config), trained on synthetic tokens or `spec.data`."""

from __future__ import annotations

import importlib
import importlib.util
import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from memfit.api.data import DataSpec
from memfit.api.problem import Attention, HuggingFaceProblem, Initialize, Task
from torch import nn

from memfit_trainer.chunked_loss import chunked_cross_entropy
from memfit_trainer.file_access import explain
from memfit_trainer.problems.base import Batch, BatchKey, TrainingProblem
from memfit_trainer.problems.data import token_batch
from memfit_trainer.problems.errors import DepthNotSupported, ProblemError
from memfit_trainer.problems.text_data import pack, packed_batch_source, read_rows, volume_path

BASE = "spec.problem.huggingface"
# Keys of an inline config that must match pretrained weights' own config (the shape memfit planned with).
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size")


@dataclass(frozen=True, slots=True)
class Finetune:
    """How the trainer (not the profiler) builds a Hugging Face problem: weights, data, load dtype."""

    data: DataSpec | None = None
    seed: int = 0
    global_batch_size: int = 1
    dtype: torch.dtype = torch.float32
    zero3_config: Mapping[str, Any] | None = None  # DeepSpeed ZeRO-3: from_pretrained under zero.Init
    environ: Mapping[str, str] = field(default_factory=dict)
    # FSDP over several ranks: only rank 0 reads the weights; the others build on the meta device and get
    # their shards from rank 0 after fully_shard (memfit_trainer.strategies.fsdp_load).
    load_on_rank0: bool = False
    rank: int = 0


def model_source(spec: HuggingFaceProblem, environ: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """Where from_pretrained reads: the volume folder (checked) or the hub id, with its keyword arguments."""
    if spec.volume_claim is not None and spec.path is not None:
        where = volume_path(spec.volume_claim, spec.path, field=f"{BASE}.path", environ=environ)
        if not (where / "config.json").is_file():
            raise ProblemError(f"{BASE}.path: {spec.path!r} on volume {spec.volume_claim!r} is not a "
                               f"save_pretrained folder (no config.json in {where})")
        return str(where), {"local_files_only": True}
    assert spec.model is not None
    return spec.model, ({"revision": spec.revision} if spec.revision else {})


def _load_error(spec: HuggingFaceProblem, source: str, exc: BaseException, *, what: str,
                hint: str = "") -> ProblemError:
    """A loader's failure naming the field. A file it could not read is named with its mode, owner and the
    trainer's ids (memfit_trainer.file_access), also when the loader calls it "No such file"; `hint` is for
    the other failures."""
    field_name = f"{BASE}.path" if spec.volume_claim else f"{BASE}.model"
    problem = explain(exc, folder=Path(source) if spec.volume_claim else None)
    if problem is not None:
        return ProblemError(f"{field_name}: {what} from {source!r}: {problem}")
    return ProblemError(f"{field_name}: {what} from {source!r}{hint}: {exc}")


def _transformers() -> Any:
    try:
        return importlib.import_module("transformers")
    except ImportError as exc:
        raise ProblemError(
            "problem.huggingface needs the `transformers` package, which is not installed in this image. "
            "To fix: use a trainer image with transformers (pip install transformers), or a builtin problem."
        ) from exc


def _config(spec: HuggingFaceProblem, transformers: Any, environ: Mapping[str, str], *, training: bool) -> Any:
    # The weights' own config.json when training from them; the profiler (no volume mounted, no weights
    # loaded) plans with the inline config when there is one.
    from_source = spec.volume_claim is not None or (spec.config is None and spec.initialization == Initialize.PRETRAINED)
    if from_source and (training or spec.config is None):
        source, kwargs = model_source(spec, environ)
        try:
            return transformers.AutoConfig.from_pretrained(source, trust_remote_code=spec.trust_remote_code,
                                                           **kwargs)
        except (OSError, ValueError) as exc:
            raise _load_error(spec, source, exc, what="cannot read the model config") from exc
    if spec.config is None:
        # Downloads config.json only (no weights); needs network access from the pod.
        source, kwargs = model_source(spec, environ)
        return transformers.AutoConfig.from_pretrained(source, trust_remote_code=spec.trust_remote_code, **kwargs)
    values = dict(spec.config)
    model_type = values.pop("model_type", None)
    if not isinstance(model_type, str):
        raise ProblemError(
            f"problem.huggingface.config for {spec.model!r} has no string `model_type` "
            '(e.g. "llama"); it is needed to pick the config class.'
        )
    try:
        return transformers.AutoConfig.for_model(model_type, **values)
    except (ValueError, KeyError) as exc:
        raise ProblemError(f"problem.huggingface.config: unknown model_type {model_type!r}: {exc}") from exc


def _reduce_depth(config: Any, depth: int, model: str) -> None:
    if getattr(config, "is_encoder_decoder", False):
        raise DepthNotSupported(f"problem.huggingface: {model!r} is an encoder-decoder (two stacks of blocks); "
                                "its depth cannot be reduced")
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int):
        raise DepthNotSupported(f"problem.huggingface: config of {model!r} has no num_hidden_layers; "
                           "its depth cannot be reduced")
    if depth > layers:
        raise DepthNotSupported(f"problem.huggingface: depth {depth} is larger than the model's {layers} layers")
    config.num_hidden_layers = depth
    for name, value in list(vars(config).items()):
        # Per-layer settings (e.g. `layer_types`) must have one entry per remaining layer.
        if isinstance(value, list) and len(value) == layers and layers > 1 and name != "architectures":
            setattr(config, name, value[:depth])


def _largest_module_list(model: nn.Module) -> list[nn.Module]:
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        return []
    return list(max(lists, key=len))


def _seq2seq_blocks(model: Any) -> list[nn.Module]:
    """An encoder-decoder's repeated units: the encoder's blocks, then the decoder's (both are checkpointed
    and sharded like a decoder's layers)."""
    return _uniform_blocks(model.get_encoder()) + _uniform_blocks(model.get_decoder())


def _uniform_blocks(stack: nn.Module) -> list[nn.Module]:
    """The longest layer list of one class (a T5 decoder block's own list of self-attention, cross-attention
    and MLP sub-layers is longer than a two-block stack, but mixed)."""
    lists = [m for m in stack.modules() if isinstance(m, nn.ModuleList) and len({type(x) for x in m}) == 1]
    return list(max(lists, key=len)) if lists else []


def shift_right(labels: torch.Tensor, config: Any) -> torch.Tensor:
    """The decoder's inputs for teacher forcing: the labels one step late, after the start token
    (`decoder_start_token_id`, else the pad token, else 0), as T5's and BART's `_shift_right` build them
    (done here: a config without `decoder_start_token_id` makes theirs raise)."""
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(config, "pad_token_id", None) or 0
    shifted = labels.new_full(labels.shape, int(start))
    shifted[:, 1:] = labels[:, :-1]
    pad = getattr(config, "pad_token_id", None) or 0
    return shifted.masked_fill(shifted == -100, int(pad))


def _seq2seq_loss(config: Any) -> Any:
    """Encoder-decoder: the encoder reads the sample, the decoder predicts the labels (teacher forcing);
    cross-entropy over upcast logits, as `_logits_loss`. `config` is the model's (a wrapper hides it)."""

    def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
        labels = batch["labels"]
        logits = model(input_ids=batch["input_ids"], decoder_input_ids=shift_right(labels, config)).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

    return loss


def _classification_loss(config: Any) -> Any:
    """Sequence classification on synthetic labels: each sample's class is its first token modulo the
    labels (deterministic in the batch), cross-entropy over the pooled logits."""
    labels = int(getattr(config, "num_labels", 2) or 2)

    def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
        logits = model(input_ids=batch["input_ids"]).logits
        return F.cross_entropy(logits.float(), batch["input_ids"][:, 0] % labels)

    return loss


def _logits_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"]).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten())


# Config keys of models whose logits are transformed after the head (Gemma-2/3 soft-capping, Cohere's and
# Granite's scaling): a chunked loss over the bare head would compute another loss.
LOGIT_SOFTCAP_KEYS = ("final_logit_softcapping",)
LOGIT_SCALE_KEYS = ("logit_scale", "logits_scaling")


def _chunked_logits_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """_logits_loss's value (the labels are already next-token targets), from the chunked forward."""
    return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss  # type: ignore[no-any-return]


def _with_chunked_loss(problem: TrainingProblem) -> TrainingProblem:
    """Bind a forward on the model instance (so DDP, FSDP2 and DeepSpeed call it through their wrappers) that,
    given labels, runs the decoder and then memfit_trainer.chunked_loss over the output embeddings; without
    labels (eval) it is the model's own forward."""
    model: Any = problem.model
    config = model.config
    transformed = [k for k in LOGIT_SOFTCAP_KEYS if getattr(config, k, None) is not None] + [
        k for k in LOGIT_SCALE_KEYS if getattr(config, k, None) not in (None, 1, 1.0)]
    if transformed:
        raise ValueError(f"strategy.chunkedLoss: {type(model).__name__} transforms its logits after the head "
                         f"({', '.join(transformed)}); disable strategy.chunkedLoss for this model")
    own_forward = model.forward
    output_class = importlib.import_module("transformers.modeling_outputs").CausalLMOutputWithPast

    def forward(self: Any, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                **kwargs: Any) -> Any:
        if labels is None:
            return own_forward(input_ids=input_ids, **kwargs)
        hidden = self.get_decoder()(input_ids=input_ids, **kwargs).last_hidden_state
        return output_class(loss=chunked_cross_entropy(self.get_output_embeddings(), hidden, labels))

    model.forward = types.MethodType(forward, model)
    return replace(problem, loss_fn=_chunked_logits_loss)


def _hidden_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    # Models without an LM head: regress the last hidden state to zero (a synthetic, differentiable task).
    return model(input_ids=batch["input_ids"]).last_hidden_state.float().pow(2).mean()


def _check_against_inline(spec: HuggingFaceProblem, config: Any) -> None:
    for key in SHAPE_KEYS:
        planned = (spec.config or {}).get(key)
        actual = getattr(config, key, None)
        if planned is not None and actual is not None and planned != actual:
            raise ProblemError(f"{BASE}.config.{key}: the inline config says {planned!r} but the pretrained "
                               f"weights' config says {actual!r}; fix or remove the inline config")


def _check_positions(spec: HuggingFaceProblem, config: Any) -> None:
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if isinstance(positions, int) and spec.sequence_length > positions:
        raise ProblemError(f"{BASE}.sequenceLength: {spec.sequence_length} exceeds the model's "
                           f"max_position_embeddings {positions}; use at most {positions}")


def _tokenizer(spec: HuggingFaceProblem, transformers: Any, environ: Mapping[str, str]) -> Any:
    source, kwargs = model_source(spec, environ)
    try:
        return transformers.AutoTokenizer.from_pretrained(source, trust_remote_code=spec.trust_remote_code,
                                                          **kwargs)
    except (OSError, ValueError, TypeError) as exc:
        raise _load_error(spec, source, exc, what="cannot load a tokenizer",
                          hint=" (spec.data is tokenized with the model's own tokenizer; save it beside the weights)"
                          ) from exc


def _pretrained(spec: HuggingFaceProblem, transformers: Any, config: Any, finetune: Finetune) -> Any:
    auto = _auto_class(transformers, spec, config)
    attn = attention_implementation(spec, training=True)
    if finetune.load_on_rank0 and finetune.rank != 0:
        # The shapes only: no memory for weights on this rank until its shards arrive from rank 0.
        with torch.device("meta"):
            return auto.from_config(
                config, dtype=finetune.dtype, attn_implementation=attn, trust_remote_code=spec.trust_remote_code)
    source, kwargs = model_source(spec, finetune.environ)
    keep_alive = None
    if finetune.zero3_config is not None:
        # transformers builds the model under deepspeed.zero.Init while this object lives: each rank
        # materialises only its partition of the weights, never the whole model.
        import deepspeed  # type: ignore[import-untyped]
        from transformers.integrations import HfDeepSpeedConfig

        # DeepSpeed's config reads the world size from deepspeed.comm: join it to the existing group first.
        deepspeed.init_distributed(auto_mpi_discovery=False)
        keep_alive = HfDeepSpeedConfig(dict(finetune.zero3_config))
    try:
        return auto.from_pretrained(
            source, config=config, dtype=finetune.dtype, low_cpu_mem_usage=True, attn_implementation=attn,
            trust_remote_code=spec.trust_remote_code, **kwargs)
    except (OSError, ValueError) as exc:
        raise _load_error(spec, source, exc, what="cannot load pretrained weights") from exc
    finally:
        del keep_alive


AUTO_CLASSES = {
    Task.CAUSAL_LM: "AutoModelForCausalLM",
    Task.MASKED_LM: "AutoModelForMaskedLM",
    Task.SEQ2SEQ_LM: "AutoModelForSeq2SeqLM",
    Task.SEQUENCE_CLASSIFICATION: "AutoModelForSequenceClassification",
}
ATTENTION = {Attention.EAGER: "eager", Attention.SDPA: "sdpa", Attention.FLASH: "flash_attention_2"}


def task_of(spec: HuggingFaceProblem, config: Any) -> Task:
    """The task trained: `spec.task`, auto = seq2seq-lm for an encoder-decoder (T5, BART), else causal-lm.
    A task the architecture cannot train is refused naming the field."""
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    task = spec.task_kind
    if task == Task.AUTO:
        return Task.SEQ2SEQ_LM if seq2seq else Task.CAUSAL_LM
    if (task == Task.SEQ2SEQ_LM) != seq2seq and task in (Task.SEQ2SEQ_LM, Task.CAUSAL_LM):
        kind = "an encoder-decoder" if seq2seq else "not an encoder-decoder"
        raise ProblemError(f"{BASE}.task: {spec.name!r} is {kind}; {task.value} needs "
                           f"{'none' if task == Task.CAUSAL_LM else 'one'} (use auto)")
    return task


def _auto_class(transformers: Any, spec: HuggingFaceProblem, config: Any) -> Any:
    """The transformers Auto class of the job's task."""
    return getattr(transformers, AUTO_CLASSES[task_of(spec, config)])


def attention_implementation(spec: HuggingFaceProblem, *, training: bool) -> str:
    """transformers' `attn_implementation` for `spec.attention`. flash needs the flash-attn package and a
    GPU: the profiler measures sdpa without them (the same memory: the scores are never materialised);
    the trainer refuses to train without them."""
    attention = spec.attention_kind
    if attention != Attention.FLASH:
        return ATTENTION[attention]
    if importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available():
        return ATTENTION[attention]
    if not training:
        return ATTENTION[Attention.SDPA]
    raise ProblemError(f"{BASE}.attention: flash needs the flash-attn package and a CUDA GPU in the trainer "
                       "image; use sdpa (the same memory) or a trainer image with flash-attn")


def _eval_source(samples: Any, limit: int) -> Any:
    def batches(micro: int) -> list[Batch]:
        count = min(limit, len(samples))
        return [samples.batch(list(range(i, min(i + micro, count)))) for i in range(0, count, micro)]

    return batches


def build_huggingface(spec: HuggingFaceProblem, *, depth: int | None = None,
                      finetune: Finetune | None = None) -> TrainingProblem:
    """A transformers model; causal-LM head when one exists.

    Without `finetune` (profiling) the weights are random, built from the config (inline, or the pretrained
    folder's config.json) and the data synthetic. With it (training), `initialize: pretrained` loads the
    weights in `finetune.dtype` and `spec.data` is tokenized with the model's tokenizer and packed.
    `depth` sets the config's `num_hidden_layers` (the generic name every transformers config maps to
    its layer count) and cuts per-layer lists (`layer_types`) to match."""
    transformers = _transformers()
    environ: Mapping[str, str] = finetune.environ if finetune is not None else os.environ
    config = _config(spec, transformers, environ, training=finetune is not None)
    config.use_cache = False
    if spec.task_kind == Task.SEQUENCE_CLASSIFICATION and not isinstance(getattr(config, "pad_token_id", None), int):
        # A decoder pools each sample's last non-pad token and needs a pad id for batches over one sample.
        eos = getattr(config, "eos_token_id", None)
        config.pad_token_id = eos if isinstance(eos, int) else 0
    _check_positions(spec, config)
    if finetune is not None and (spec.volume_claim is not None or spec.initialization == Initialize.PRETRAINED):
        _check_against_inline(spec, config)
    saved_dtype = checkpoint_dtype(config)  # read before loading: from_pretrained records the load dtype
    if depth is not None:
        _reduce_depth(config, depth, spec.name)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 2:
        raise ProblemError(f"problem.huggingface: config of {spec.name!r} has no vocab_size")
    loss_fn = _logits_loss
    pretrained = finetune is not None and spec.initialization == Initialize.PRETRAINED and depth is None
    if pretrained:
        assert finetune is not None
        model = _pretrained(spec, transformers, config, finetune)
    else:
        attn = attention_implementation(spec, training=finetune is not None)
        auto = _auto_class(transformers, spec, config)
        try:
            model = auto.from_config(config, attn_implementation=attn)
        except ValueError:
            if spec.task_kind != Task.AUTO:
                raise ProblemError(f"{BASE}.task: transformers has no {spec.task_kind.value} head for "
                                   f"{type(config).__name__}") from None
            model = transformers.AutoModel.from_config(config, attn_implementation=attn)
            loss_fn = _hidden_loss
    task = task_of(spec, config)
    seq2seq = task == Task.SEQ2SEQ_LM and loss_fn is _logits_loss
    if seq2seq:
        loss_fn = _seq2seq_loss(model.config)
    elif task == Task.SEQUENCE_CLASSIFICATION:
        loss_fn = _classification_loss(model.config)
    blocks = _seq2seq_blocks(model) if seq2seq else _largest_module_list(model)
    if not blocks:
        raise ProblemError(
            f"problem.huggingface: found no layer list (nn.ModuleList) in {type(model).__name__}"
        )

    def make(key: BatchKey) -> Batch:
        return token_batch(key, vocab=vocab, sequence_length=spec.sequence_length)

    make_batch: Any = make
    tokenizer = None
    eval_batches = None
    data = finetune.data if finetune is not None else None
    if finetune is not None and ((data is not None and data.real) or pretrained):
        tokenizer = _tokenizer(spec, transformers, environ)
    if finetune is not None and data is not None and data.real:
        train = pack(read_rows(data, eval_set=False, environ=environ), data=data, tokenizer=tokenizer,
                     sequence_length=spec.sequence_length, keep_tail=False)
        make_batch = packed_batch_source(train, seed=finetune.seed, global_batch_size=finetune.global_batch_size)
        if data.has_eval:
            held_out = pack(read_rows(data, eval_set=True, environ=environ), data=data, tokenizer=tokenizer,
                            sequence_length=spec.sequence_length, limit=data.eval_samples)
            eval_batches = _eval_source(held_out, data.eval_samples)
    return TrainingProblem(
        name=f"hf-{spec.name}",
        model=model,
        blocks=blocks,
        make_batch=make_batch,
        loss_fn=loss_fn,
        tokens_per_sample=spec.sequence_length,
        tokenizer=tokenizer,
        eval_batches=eval_batches,
        saved_dtype=saved_dtype if pretrained else None,
        after_shard=_rank0_loader(model, finetune) if pretrained and finetune is not None else None,
        enable_chunked_loss=_with_chunked_loss if loss_fn is _logits_loss and task == Task.CAUSAL_LM else None,
    )


def _rank0_loader(model: Any, finetune: Finetune) -> Any:
    if not finetune.load_on_rank0:
        return None
    from memfit_trainer.strategies.fsdp_load import load_from_rank0

    # Rank 0's full state dict, taken before any wrapping (its names are the model's own).
    full = model.state_dict() if finetune.rank == 0 else None
    return lambda sharded, device: load_from_rank0(sharded, full, device)


def checkpoint_dtype(config: Any) -> torch.dtype | None:
    """The floating dtype a config.json names (`dtype`, older `torch_dtype`); None when it names none."""
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, str):
        value = getattr(torch, value, None)
    return value if isinstance(value, torch.dtype) and value.is_floating_point else None
