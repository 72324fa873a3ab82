"""The LoRA/QLoRA adapter layout the memory model needs: what one block's linear layers look like, which
of them carry adapters, and how the frozen base is stored."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memfit.api.peft import AdapterSettings
from memfit.api.peft_layers import ATTENTION_OUTPUT_GROUP, block_input_groups


@dataclass(frozen=True, slots=True)
class AdapterLayout:
    """One block's linear layers, grouped by the input they share, with the adapters' settings.

    `groups` holds (input width, ((output width, targeted), ...)) per shared input; the model has
    `layers` identical blocks. Adapters are A (rank x in) and B (out x rank) per targeted layer.
    """

    rank: int
    dropout: bool
    double_quant: bool
    groups: tuple[tuple[int, tuple[tuple[int, bool], ...]], ...]

    @property
    def targeted(self) -> tuple[tuple[int, int], ...]:
        """(in, out) of each targeted linear layer of a block."""
        return tuple((i, o) for i, members in self.groups for o, hit in members if hit)

    @property
    def adapter_parameters_per_block(self) -> int:
        return sum(self.rank * (i + o) for i, o in self.targeted)

    @property
    def linear_weights_per_block(self) -> int:
        """Weights of every linear layer of a block (what QLoRA stores in 4 bits; biases are not)."""
        return sum(i * o for i, members in self.groups for o, _ in members)

    @property
    def linears_per_block(self) -> int:
        return sum(len(members) for _, members in self.groups)

    @property
    def largest_linear_weights(self) -> int:
        return max((i * o for i, members in self.groups for o, _ in members), default=0)

    @property
    def largest_adapter_tensor(self) -> int:
        return max((self.rank * max(i, o) for i, o in self.targeted), default=0)

    @property
    def small_adapter_tensors_per_block(self) -> int:
        """Adapter elements in tensors under bitsandbytes' 4096-element 8-bit minimum (32-bit state)."""
        return sum(n for i, o in self.targeted for n in (self.rank * i, self.rank * o) if n < 4096)

    @property
    def saved_input_width(self) -> int:
        """Per token, the widths of the block inputs some adapter saves (a shared input once)."""
        return sum(i for i, members in self.groups if any(hit for _, hit in members))

    @property
    def unsaved_input_width(self) -> int:
        """Per token, the widths of the block inputs only frozen layers read: with no weight gradient to
        compute, autograd does not save them. The attention output is saved by the attention kernel
        (SDPA keeps its output for backward) whatever reads it."""
        return sum(i for index, (i, members) in enumerate(self.groups)
                   if index != ATTENTION_OUTPUT_GROUP and not any(hit for _, hit in members))

    @property
    def private_saved_input_width(self) -> int:
        """Per token, the saved block inputs that only adapters keep alive (the attention output stays
        saved by the attention kernel): what adapter dropout frees by saving its own output instead."""
        return sum(i for index, (i, members) in enumerate(self.groups)
                   if index != ATTENTION_OUTPUT_GROUP and any(hit for _, hit in members))

    @property
    def first_input_targeted_width(self) -> int:
        """Per token, the block's first input if an adapter reads it (0 otherwise)."""
        i, members = self.groups[0]
        return i if any(hit for _, hit in members) else 0

    @property
    def widest_targeted_input(self) -> int:
        """The widest block input an adapter reads (the MLP's inner width when its output layer is
        targeted): its backward holds the base's and the adapter's input gradients and their sum."""
        return max((i for i, members in self.groups if any(hit for _, hit in members)), default=0)

    @property
    def widest_targeted_output(self) -> int:
        """The widest output of an adapted layer."""
        return max((o for _, o in self.targeted), default=0)

    @property
    def dropout_input_width(self) -> int:
        """Per token, the inputs of the adapters' own dropout (one per targeted layer)."""
        return sum(i for i, _ in self.targeted) if self.dropout else 0

    @property
    def adapter_output_width(self) -> int:
        """Per token, the A outputs (rank wide) that B saves, one per targeted layer."""
        return self.rank * len(self.targeted)


def adapter_layout(problem: Mapping[str, Any] | None, adapter: AdapterSettings) -> AdapterLayout | None:
    """The layout of `adapter` on the problem's blocks, or None when the architecture is not known
    analytically (entrypoints, other Hugging Face model types)."""
    groups = block_input_groups(problem, list(adapter.target_modules))
    if groups is None:
        return None
    return AdapterLayout(rank=adapter.rank, dropout=adapter.dropout > 0, double_quant=adapter.double_quant,
                         groups=tuple((i, tuple(members)) for i, members in groups))
