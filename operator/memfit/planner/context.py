"""The search context: the job's planning inputs and the caches shared across offers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

from memfit.api.common import Engine, Offload, PeftMethod, Precision
from memfit.api.job import Minimize, OptimizerKind
from memfit.api.training_config import accumulation_steps, samples_per_gpu
from memfit.memory.activations import ActivationTerms, activation_terms
from memfit.memory.adapter import AdapterLayout
from memfit.memory.calibration import Calibration
from memfit.memory.peft import peft_activation_terms
from memfit.memory.predict import MemoryTerms, memory_terms
from memfit.memory.shape import Shape
from memfit.memory.strategy import Strategy
from memfit.planner.checkpoint_writes import (
    DEFAULT_CHECKPOINT_WRITE_GBPS,
    CheckpointBytes,
    checkpoint_bytes,
    write_seconds,
)
from memfit.planner.explain import Lack
from memfit.planner.interruptions import (
    NO_PERSISTENT_CHECKPOINT,
    ON_DEMAND_EVERY_STEPS,
    CheckpointPolicy,
    chosen_every_steps,
    expected_hours,
    priced_every_steps,
)
from memfit.planner.measured import PeakCorrections
from memfit.planner.offers import Layout, Offer
from memfit.planner.space import ENGINES, OFFLOADS, Choice
from memfit.timing.step import EngineTraffic, GpuSpeed, TimeTerms, engine_traffic, time_terms

Group = tuple[tuple[int, ...], list[Choice]]  # a group's ranks and its members in visit order
# The choices searched, what an offer lacks when it runs none of them, their groups on one GPU and on more.
OfferGroups = tuple[Sequence[Choice], tuple[Lack, ...], list[Group], list[Group]]

if TYPE_CHECKING:
    from memfit.planner.result import Candidate


@dataclass(frozen=True, slots=True)
class SearchContext:
    """Everything about the job the search needs, plus caches shared across offers."""

    shape: Shape
    optimizer: OptimizerKind
    global_batch: int
    steps: int
    headroom_percent: int
    minimize: Minimize
    max_cost_per_hour: float | None
    deadline_hours: float | None
    max_nodes: int
    pinned_micro_batch: int | None
    calibration: Calibration | None
    corrections: PeakCorrections
    flops_per_sample: float
    mfu: float | None
    adapter: AdapterLayout | None = None  # the LoRA/QLoRA layout PEFT choices train
    # Persistent checkpoints (or none: they die with a lost node), at the job's interval or memfit's.
    checkpoint: CheckpointPolicy = NO_PERSISTENT_CHECKPOINT
    # Pool -> GB/s a node writes checkpoints at (host.checkpointWriteGBps; absent: the default).
    checkpoint_write_gbps: Mapping[str, float] = field(default_factory=dict)
    # The pinned strategy fields by path (`strategy.precision` -> `bf16`): the reasons name them.
    pins: Mapping[str, str] = field(default_factory=dict)
    # Keyed by choice rank or memory id (unique within one plan call), world size (and GPUs per node).
    memory_cache: dict[tuple[int, int], MemoryTerms] = field(default_factory=dict)
    time_cache: dict[tuple[int, int, int], TimeTerms] = field(default_factory=dict)
    min_peak_cache: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    activation_cache: dict[tuple[object, ...], ActivationTerms] = field(default_factory=dict)
    # Leanest member of a group at a world size, once every member's smallest peak is known.
    group_min_cache: dict[tuple[tuple[int, ...], int], tuple[int, Choice]] = field(default_factory=dict)
    group_cache: dict[tuple[int, ...], list[Group]] = field(default_factory=dict)
    twin_rank_cache: dict[int, dict[int, int]] = field(default_factory=dict)
    # Least engine traffic and offload seconds of a group, by its engines (_engines), layout, micro-batch.
    traffic_cache: dict[tuple[object, ...], float] = field(default_factory=dict)
    offload_cache: dict[tuple[object, ...], float] = field(default_factory=dict)
    engines_cache: dict[int, tuple[object, ...]] = field(default_factory=dict)  # by id(members)
    # An offer's lacks and runnable groups by what the search reads of the offer (planner.search).
    offer_groups_cache: dict[tuple[bool, ...], OfferGroups] = field(default_factory=dict)
    # The search's loose lower bound on a group's step seconds by (precision, checkpointing, PEFT method,
    # chunked loss, world size, GPUs per node, speed), and its tight one by (id(members), world size, GPUs per node, speed).
    bound_cache: dict[tuple[object, ...], float] = field(default_factory=dict)
    tight_bound_cache: dict[tuple[object, ...], float] = field(default_factory=dict)
    # Bytes the busiest node writes per checkpoint, by choice rank, world size and GPUs per node.
    checkpoint_bytes_cache: dict[int, CheckpointBytes] = field(default_factory=dict)  # by choice rank
    bound_bytes_cache: dict[tuple[int, int], float] = field(default_factory=dict)  # (id(members), nodes)

    def with_fresh_caches(self, **changes: object) -> SearchContext:
        """A copy with `changes` and every cache empty (a cached value may depend on what changed; the
        caches keyed by a group's identity hold only while that context's group lists live)."""
        empty: dict[str, object] = {f.name: {} for f in fields(self) if f.name.endswith("_cache")}
        return replace(self, **changes, **empty)  # type: ignore[arg-type]

    @property
    def checkpoint_every_steps(self) -> int | None:
        """The interval of an estimate at a fixed interval: the job's, the old default when memfit
        chooses, None without a persistent checkpoint."""
        if not self.checkpoint.persistent:
            return None
        return self.checkpoint.every_steps or ON_DEMAND_EVERY_STEPS

    def trainable(self, choice: Choice) -> int:
        """Parameters the choice trains: all of them, or the LoRA/QLoRA adapters."""
        if choice.config.peft == PeftMethod.NONE or self.adapter is None:
            return self.shape.trainable
        return self.shape.layers * self.adapter.adapter_parameters_per_block

    def per_gpu(self, world_size: int) -> int | None:
        """Samples per rank per optimizer step, None when the global batch does not split over the ranks
        (api.training_config's rule)."""
        return samples_per_gpu(self.global_batch, world_size)

    def samples_per_gpu(self, world_size: int) -> int:
        """`per_gpu` of a layout the search kept (it splits evenly)."""
        per_gpu = self.per_gpu(world_size)
        assert per_gpu is not None, f"global batch {self.global_batch} does not split over {world_size} ranks"
        return per_gpu

    def accumulation(self, world_size: int, micro_batch_size: int) -> int | None:
        return accumulation_steps(self.global_batch, world_size=world_size, micro_batch_size=micro_batch_size)

    def expected_hours(self, offer: Offer, layout: Layout, step_seconds: float, write_seconds: float = 0.0) -> float:
        """Hours of the run on `layout` of `offer`, with its checkpoint writes (`write_seconds` each) and
        the expected lost work and restarts of its interruptions (planner.interruptions); non-decreasing
        in `step_seconds` and in `write_seconds`."""
        every = self.priced_every_steps(offer, layout.nodes, step_seconds, write_seconds)
        return expected_hours(hours=self.steps * step_seconds / 3600, step_seconds=step_seconds,
                              rate_per_node_hour=offer.interruption_rate_per_hour, nodes=layout.nodes,
                              checkpoint_every_steps=every, write_seconds=write_seconds)

    def every_steps(self, offer: Offer, nodes: int, step_seconds: float, write_seconds: float) -> int | None:
        """Steps between persistent checkpoints on `nodes` nodes of `offer`: the job's, or memfit's
        choice (planner.interruptions); None without a persistent checkpoint."""
        if not self.checkpoint.chosen:
            return self.checkpoint_every_steps
        return chosen_every_steps(steps=self.steps, step_seconds=step_seconds, write_seconds=write_seconds,
                                  rate_per_hour=max(0.0, offer.interruption_rate_per_hour) * nodes)

    def priced_every_steps(self, offer: Offer, nodes: int, step_seconds: float, write_seconds: float) -> float | None:
        """The interval `expected_hours` prices (planner.interruptions `priced_every_steps`)."""
        if not self.checkpoint.chosen:
            return self.checkpoint_every_steps
        return priced_every_steps(steps=self.steps, step_seconds=step_seconds, write_seconds=write_seconds,
                                  rate_per_hour=max(0.0, offer.interruption_rate_per_hour) * nodes)

    def candidate_checkpoints(self, candidate: Candidate, offer: Offer) -> tuple[int | None, float]:
        """(steps between persistent checkpoints, seconds per checkpoint write) of a candidate on its
        offer, as the search priced them; (None, 0) without a persistent checkpoint."""
        if not self.checkpoint.persistent:
            return None, 0.0
        writes = write_seconds(self.checkpoint_bytes_per_node(candidate.strategy),
                               write_gbps=self.write_gbps(offer.pool))
        return self.every_steps(offer, candidate.nodes, candidate.step.step_seconds, writes), writes

    def write_seconds(self, offer: Offer, layout: Layout, choice: Choice) -> float:
        """Seconds one checkpoint of `choice` takes to write on `layout` of `offer` (0 without a
        persistent checkpoint: writes to the pod's own disk are not priced)."""
        if not self.checkpoint.persistent:
            return 0.0
        per_node = self.choice_checkpoint_bytes(choice).per_node(layout.nodes)
        return write_seconds(per_node, write_gbps=self.write_gbps(offer.pool))

    def choice_checkpoint_bytes(self, choice: Choice) -> CheckpointBytes:
        """What one checkpoint of `choice` writes (the same on every layout: only its split over nodes
        differs)."""
        found = self.checkpoint_bytes_cache.get(choice.rank)
        if found is None:
            strategy = choice.strategy(optimizer=self.optimizer, world_size=1, gpus_per_node=1,
                                       adapter=self.adapter)
            found = self.checkpoint_bytes_cache[choice.rank] = self._checkpoint_bytes(strategy)
        return found

    def checkpoint_bytes_per_node(self, strategy: Strategy) -> float:
        """Bytes the busiest node writes per checkpoint of `strategy` (planner.checkpoint_writes)."""
        return self._checkpoint_bytes(strategy).per_node(strategy.nodes)

    def _checkpoint_bytes(self, strategy: Strategy) -> CheckpointBytes:
        trainable = self.shape.trainable
        if strategy.config.peft != PeftMethod.NONE and self.adapter is not None:
            trainable = self.shape.layers * self.adapter.adapter_parameters_per_block
        return checkpoint_bytes(self.shape, strategy, trainable=trainable)

    def write_gbps(self, pool: str) -> float:
        """GB/s a node of `pool` writes checkpoints at."""
        return self.checkpoint_write_gbps.get(pool, DEFAULT_CHECKPOINT_WRITE_GBPS)

    def bound_write_seconds(self, offer: Offer, layout: Layout, members: list[Choice]) -> float:
        """A lower bound on the write seconds of every member, for the search's bound (expected hours
        are non-decreasing in the write time, planner.interruptions)."""
        if not self.checkpoint.persistent:
            return 0.0
        key = (id(members), layout.nodes)  # the groups' member lists live as long as the context
        least = self.bound_bytes_cache.get(key)
        if least is None:
            least = self.bound_bytes_cache[key] = min(
                self.choice_checkpoint_bytes(c).per_node(layout.nodes) for c in members)
        return write_seconds(least, write_gbps=self.write_gbps(offer.pool))

    def fits_gpu(self, peak_bytes: float, usable_bytes: int) -> bool:
        """The fit rule: predicted peak x (1 + headroom) <= usable GPU memory."""
        return peak_bytes * (1 + self.headroom_percent / 100) <= usable_bytes

    def _memory_key(self, choice: Choice) -> int:
        # bf16 and fp16 twins share memory terms unless measured peaks scale their families apart.
        return choice.rank if self.corrections.by_family else choice.memory_id

    def memory(self, choice: Choice, world_size: int, gpus_per_node: int) -> MemoryTerms:
        """Cached memory terms (with calibration and measured-peak correction)."""
        key = (self._memory_key(choice), world_size)
        terms = self.memory_cache.get(key)
        if terms is None:
            strategy = choice.strategy(optimizer=self.optimizer, world_size=world_size,
                                       gpus_per_node=gpus_per_node, adapter=self.adapter)
            # Activations depend on precision and checkpointing (and autocast under DDP, and the
            # frozen base of LoRA/QLoRA) only.
            act_key = (strategy.mixed_precision, strategy.pure_bf16, choice.config.activation_checkpointing,
                       choice.config.engine == Engine.DDP, choice.config.peft, choice.config.chunked_loss,
                       choice.config.activation_offload)
            acts = self.activation_cache.get(act_key)
            if acts is None:
                acts = self.activation_cache[act_key] = _activations(self.shape, strategy)
            terms = memory_terms(self.shape, strategy, calibration=self.calibration, activations=acts)
            factor = self.corrections.factor(strategy)
            if factor != 1.0:
                terms = terms.scaled(factor)
            self.memory_cache[key] = terms
        return terms

    def groups(self, runnable: list[Choice]) -> list[Group]:
        """Runnable choices grouped by (precision, checkpointing, PEFT method) -- identical arithmetic
        but for the chunked loss's head, hence one lower bound (from a member without it) -- and by
        whether they offload (the CPU step tightens that bound), each in visit order; cached, since most
        offers run the same choices."""
        key = tuple(c.rank for c in runnable)
        cached = self.group_cache.get(key)
        if cached is None:
            by_compute: dict[tuple[object, ...], list[Choice]] = {}
            for c in runnable:
                key_ = (c.config.precision, c.config.activation_checkpointing, c.config.peft,
                        c.config.offload != Offload.NONE, c.config.activation_offload)
                by_compute.setdefault(key_, []).append(c)
            cached = [(tuple(c.rank for c in ordered), ordered)
                      for ordered in (group_order(v) for v in by_compute.values())]
            # The first list stored stays (setdefault is atomic): the caches keyed by id(members) rely on
            # a group's list living, unreplaced, as long as the context, also when plans run in threads.
            cached = self.group_cache.setdefault(key, cached)
        return cached

    def least_traffic_bytes(self, members: list[Choice], layout: Layout, micro_batch: int) -> float:
        """The least engine HBM traffic (bytes per step, timing.step.EngineTraffic) of a group's members
        on `layout` at `micro_batch`; cached per set of engines, so the groups of other checkpointing
        share it."""
        key = (self._engines(members), layout.world_size, layout.gpus_per_node, micro_batch)
        least = self.traffic_cache.get(key)
        if least is None:
            accumulation = self.samples_per_gpu(layout.world_size) // micro_batch
            least = self.traffic_cache[key] = min(
                self.engine_traffic(c, layout).hbm_bytes(accumulation) for c in members)
        return least

    def least_offload_seconds(self, members: list[Choice], layout: Layout, micro_batch: int,
                              gpu: GpuSpeed) -> float:
        """The least offload seconds per step of a group's members on `layout` of a `gpu`."""
        key = (self._engines(members), layout.world_size, layout.gpus_per_node, micro_batch, gpu.pcie_gbps)
        least = self.offload_cache.get(key)
        if least is None:
            accumulation = self.samples_per_gpu(layout.world_size) // micro_batch
            samples = self.samples_per_gpu(layout.world_size)
            least = self.offload_cache[key] = min(
                self.engine_traffic(c, layout).offload_seconds(gpu, accumulation, samples) for c in members)
        return least

    def engine_traffic(self, choice: Choice, layout: Layout) -> EngineTraffic:
        strategy = choice.strategy(optimizer=self.optimizer, world_size=layout.world_size,
                                   gpus_per_node=layout.gpus_per_node, adapter=self.adapter)
        return engine_traffic(self.shape, strategy)

    def _engines(self, members: list[Choice]) -> tuple[object, ...]:
        """What a group's engine traffic depends on: 16- or 32-bit, PEFT method and each member's engine,
        stage, offload and optimizer width (not the checkpointing, nor bf16 against fp16)."""
        found = self.engines_cache.get(id(members))
        if found is None:
            first = members[0].config
            # Activation offload moves what the checkpointing and precision leave saved (not a member's engine).
            moved = (first.activation_checkpointing, first.precision) if first.activation_offload else None
            found = self.engines_cache[id(members)] = (first.precision != Precision.FP32, first.peft, moved, tuple(
                (c.config.engine, c.config.zero_stage, c.config.offload, c.config.optimizer8bit) for c in members))
        return found

    def twin_ranks(self, members: list[Choice]) -> dict[int, int]:
        """The preferred (lowest) rank of each twin pair among a group's members, by twin id; cached per
        group (its member list lives as long as the group cache)."""
        cached = self.twin_rank_cache.get(id(members))
        if cached is None:
            cached = {}
            for c in members:
                cached[c.twin_id] = min(c.rank, cached.get(c.twin_id, c.rank))
            self.twin_rank_cache[id(members)] = cached
        return cached

    def has_min_peak(self, choice: Choice, layout: Layout) -> bool:
        """Whether `min_peak` is already known (no computation)."""
        return (self._memory_key(choice), layout.world_size) in self.min_peak_cache

    def min_peak(self, choice: Choice, layout: Layout) -> int:
        """Smallest peak over the allowed micro-batches (the pinned one, or every divisor of the
        per-GPU batch): when it does not fit, nothing of this choice fits the layout."""
        return self.smallest(choice, layout)[0]

    def min_peak_micro_batch(self, choice: Choice, layout: Layout) -> int:
        """The micro-batch at which `min_peak` is reached."""
        return self.smallest(choice, layout)[1]

    def smallest(self, choice: Choice, layout: Layout) -> tuple[int, int]:
        """(smallest peak, its micro-batch), cached."""
        key = (self._memory_key(choice), layout.world_size)
        found = self.min_peak_cache.get(key)
        if found is None:
            per_gpu = self.samples_per_gpu(layout.world_size)
            terms = self.memory(choice, layout.world_size, layout.gpus_per_node)
            if choice.config.optimizer_in_backward:  # no accumulation: the whole per-GPU batch at once
                found = (peak_bytes_int(terms, per_gpu, per_gpu), per_gpu)
            elif self.pinned_micro_batch is not None:
                b = self.pinned_micro_batch
                found = (peak_bytes_int(terms, b, per_gpu), b)
            else:
                peak, b = terms.smallest_peak(per_gpu)
                found = (int(-(-peak // 1)), b)
            self.min_peak_cache[key] = found
        return found

    def time(self, choice: Choice, layout: Layout) -> TimeTerms:
        """Cached step-time terms."""
        key = (choice.rank, layout.world_size, layout.gpus_per_node)
        terms = self.time_cache.get(key)
        if terms is None:
            strategy = choice.strategy(optimizer=self.optimizer, world_size=layout.world_size,
                                       gpus_per_node=layout.gpus_per_node, adapter=self.adapter)
            terms = time_terms(
                self.shape, strategy, samples_per_gpu_step=self.samples_per_gpu(layout.world_size),
                flops_per_sample_override=self.flops_per_sample, mfu=self.mfu,
            )
            self.time_cache[key] = terms
        return terms


def _activations(shape: Shape, strategy: Strategy) -> ActivationTerms:
    if strategy.adapter is not None:
        return peft_activation_terms(shape, strategy, strategy.adapter)
    return activation_terms(shape, strategy)


def peak_bytes_int(terms: MemoryTerms, micro_batch: int, per_gpu: int) -> int:
    # Integer bytes exactly as predict_memory reports them (MemoryEstimate.peak_bytes).
    peak = terms.peak_bytes(micro_batch, per_gpu // micro_batch)
    return int(-(-peak // 1))


def group_order(members: list[Choice]) -> list[Choice]:
    """Visit order inside a group: no offload before offload (a tight bound early), and each 8-bit
    choice right before its 32-bit twin."""
    return sorted(members, key=lambda c: (
        c.config.offload != Offload.NONE, ENGINES.index(c.config.engine), c.config.zero_stage, OFFLOADS.index(c.config.offload),
        not c.config.optimizer8bit,
    ))
