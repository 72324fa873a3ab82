"""The search: for every offer, the best fitting configuration by branch and bound.

For one offer, candidates are grouped by (layout, precision, checkpointing): the compute time of a
group at its largest possible micro-batch is a lower bound on every member's objective (members
differ only in memory, communication and offload, which can only add time). Groups are visited in
increasing bound order and the visit stops once a bound exceeds the best found. Inside a group each
configuration's largest fitting micro-batch comes in closed form from its memory terms (peak is
linear in the micro-batch, and step time falls as the micro-batch grows), so micro-batches are never
enumerated. Memory and time terms are cached per (configuration, world size) across offers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from memfit.api.common import Checkpointing, Offload, Precision
from memfit.api.job import Minimize
from memfit.api.training_config import TrainingConfig
from memfit.memory.predict import MemoryTerms
from memfit.planner.context import Group, SearchContext, peak_bytes_int
from memfit.planner.explain import Lack, OfferFailures
from memfit.planner.offers import Layout, Offer
from memfit.planner.result import Candidate
from memfit.planner.space import Choice, divisors
from memfit.timing.step import MIN_EXPOSED, ring_seconds_per_byte

# The most compute a step's collectives hide behind, in units of the step's compute (timing.step).
HIDING_WINDOWS = 5 / 3


@dataclass(frozen=True, slots=True)
class OfferOutcome:
    """The best candidate on one offer (None when nothing fits) and what failed."""

    best: Candidate | None
    failures: OfferFailures


# Objectives closer than this are a tie: the step-time model does not resolve them (docs/step_time.md),
# so the plan goes to fewer GPUs and the simpler configuration instead.
TIE_TOLERANCE = 0.01
_LOG_TIE_STEP = math.log1p(TIE_TOLERANCE)

# A group's tight bound (with its engines' traffic) is computed only where its loose bound is within this
# many tie tiers (about 5%) of the best found: below that, traffic (a few percent of a step) rarely lifts it.
TIGHTEN_WITHIN_TIERS = 5

# (objective tier, other objective tier, GPUs, preference rank): what decides between two candidates
# before their micro-batch and pool name.
Key = tuple[float, float, int, int]


def tier(value: float) -> float:
    """The tie tier of an objective: objectives within TIE_TOLERANCE of each other in the same
    logarithmic tier tie (boundaries at powers of 1 + TIE_TOLERANCE, so the relation is transitive).
    Non-decreasing in `value`, so a lower bound on an objective gives a lower bound on its tier."""
    if value <= 0:
        return -math.inf
    if value == math.inf:
        return math.inf
    return float(math.floor(math.log(value) / _LOG_TIE_STEP))


def _objectives(minimize: Minimize, hours: float, cost: float) -> tuple[float, float]:
    return (cost, hours) if minimize == Minimize.COST else (hours, cost)


def bound_key(minimize: Minimize, hours: float, price_per_hour: float, gpus: int, rank: int) -> Key:
    """The key of a candidate with these lower bounds on its hours and rank (on `gpus` GPUs): every such
    candidate's key is at least this (each part is a lower bound, so the tuple is lexicographically)."""
    first, second = _objectives(minimize, hours, hours * price_per_hour)
    return (tier(first), tier(second), gpus, rank)


def objective_key(c: Candidate, minimize: Minimize) -> tuple[float, ...]:
    """Sort key: the objective's tie tier, the other objective's, fewer GPUs, preference, bigger
    micro-batch, then the exact objectives (the pool name breaks what remains)."""
    first, second = _objectives(minimize, c.hours, c.total_cost)
    return (tier(first), tier(second), c.gpus, c.rank, -c.strategy.config.micro_batch_size, first, second)


def _better(a: Candidate, b: Candidate | None, minimize: Minimize) -> bool:
    if b is None:
        return True
    ka, kb = objective_key(a, minimize), objective_key(b, minimize)
    return ka < kb or (ka == kb and a.pool < b.pool)


def _beyond(key: Key, best: Key | None) -> bool:
    """Whether a candidate whose key is at least `key` loses to one with key `best` (None: nothing found
    yet). An equal key may still win on micro-batch or pool name, so it is not beyond."""
    return best is not None and key > best


def _refused_precision(precision: Precision) -> Precision:
    """The precision whose refusal rules this one out: bf16-pure runs the bf16 kernels autocast does."""
    return Precision.BF16 if precision == Precision.BF16_PURE else precision


def _is_refused(config: TrainingConfig, refused: frozenset[tuple[Precision, Checkpointing]]) -> bool:
    """Whether the profile refused this (precision, checkpointing) on the GPU. selective-op (never profiled)
    runs the ops of every mode: refused when its precision was refused with any."""
    precision = _refused_precision(config.precision)
    if config.activation_checkpointing == Checkpointing.SELECTIVE_OP:
        return any(p == precision for p, _ in refused)
    return (precision, config.activation_checkpointing) in refused


def _lacks(offer: Offer, choice: Choice, refused: frozenset[tuple[Precision, Checkpointing]]) -> frozenset[Lack]:
    """What `offer` lacks that `choice` needs (`refused`: what the profile could not run on this GPU)."""
    config = choice.config
    return frozenset(lack for lack, missing in (
        (Lack.REFUSED, bool(refused) and _is_refused(config, refused)),
        (Lack.BF16, config.precision in (Precision.BF16, Precision.BF16_PURE) and not offer.supports_bf16),
        (Lack.HOST_MEMORY, (config.offload == Offload.CPU or config.activation_offload)
         and offer.host_bytes_per_node is None),
        (Lack.NVME, config.offload == Offload.NVME and offer.nvme_bytes_per_node <= 0),
    ) if missing)


def _offer_choices(offer: Offer, choices: Sequence[Choice],
                   refused: frozenset[tuple[Precision, Checkpointing]] = frozenset(),
                   ) -> tuple[list[Choice], tuple[Lack, ...]]:
    """Choices the offer can run (fp16 is skipped where bf16 is at least as fast: same memory), and,
    when it can run none, what it lacks that they need: what every one of them needs (bf16 pinned on a
    T4), else everything that stopped one. A lack that only some allowed choices have is no reason: the
    others were searched (a T4 trains in fp16 when precision is auto)."""
    out: list[Choice] = []
    lacking: list[frozenset[Lack]] = []
    has_bf16_choice = any(c.config.precision == Precision.BF16 for c in choices)
    fp16_dominated = offer.supports_bf16 and has_bf16_choice and (
        offer.speed.fp16_tflops <= offer.speed.bf16_tflops
    )
    # What a choice lacks depends on these three.
    known: dict[tuple[Precision, Offload, Checkpointing, bool], frozenset[Lack]] = {}
    for c in choices:
        needs = (c.config.precision, c.config.offload, c.config.activation_checkpointing, c.config.activation_offload)
        lacks = known.get(needs)
        if lacks is None:
            lacks = known[needs] = _lacks(offer, c, refused)
        if lacks:
            lacking.append(lacks)
        elif not (c.config.precision == Precision.FP16 and fp16_dominated):
            out.append(c)
    if out or not lacking:
        return out, ()
    named = frozenset.intersection(*lacking) or frozenset.union(*lacking)
    return out, tuple(lack for lack in Lack if lack in named)


def _offer_groups(ctx: SearchContext, offer: Offer, choices: Sequence[Choice],
                  ) -> tuple[tuple[Lack, ...], list[Group], list[Group]]:
    """What the offer lacks (when it runs no choice) and its runnable choices' groups on one GPU and on
    more (the optimizer step in backward runs on one GPU only), cached by what `_offer_choices` reads of
    an offer: most offers of a plan run the same choices."""
    refused = offer.refused
    signature = (offer.supports_bf16, offer.speed.fp16_tflops <= offer.speed.bf16_tflops,
                 offer.host_bytes_per_node is None, offer.nvme_bytes_per_node <= 0, bool(refused))
    cached = ctx.offer_groups_cache.get(signature)
    if cached is None or cached[0] is not choices:  # holding `choices` keeps its identity unique
        runnable, lacks = _offer_choices(offer, choices, refused)
        single = ctx.groups(runnable)
        multi = ctx.groups([c for c in runnable if not c.config.optimizer_in_backward])
        cached = ctx.offer_groups_cache[signature] = (choices, lacks, single, multi)
    return cached[1], cached[2], cached[3]


def _micro_batch(ctx: SearchContext, terms: MemoryTerms, per_gpu: int, usable: int, *,
                 whole: bool = False) -> int:
    """Largest micro-batch dividing `per_gpu` that fits (0 when none); exact fit rule checked. `whole`:
    only the whole per-GPU batch (no accumulation: the optimizer step in backward)."""
    if whole:
        fits = ctx.pinned_micro_batch in (None, per_gpu) and ctx.fits_gpu(peak_bytes_int(terms, per_gpu, per_gpu), usable)
        return per_gpu if fits else 0
    if ctx.pinned_micro_batch is not None:
        b = ctx.pinned_micro_batch
        return b if ctx.fits_gpu(peak_bytes_int(terms, b, per_gpu), usable) else 0
    if ctx.fits_gpu(peak_bytes_int(terms, per_gpu, per_gpu), usable):
        return per_gpu
    budget = usable / (1 + ctx.headroom_percent / 100)
    limit = terms.max_micro_batch(budget, accumulation_above_one=True)
    if limit <= 0:
        return 0
    for b in reversed(divisors(per_gpu)):
        if b >= per_gpu or b > limit:
            continue
        if ctx.fits_gpu(peak_bytes_int(terms, b, per_gpu), usable):
            return b
    return 0


def _host_micro_batch(ctx: SearchContext, terms: MemoryTerms, per_gpu: int, b: int, offer: Offer, g: int, *,
                      whole: bool) -> int:
    """Activation offload: the largest micro-batch up to `b` (the device's choice) whose offloaded activations
    also fit the node's host RAM, and that still fits the device (0 when none does; `whole`: only `b`)."""
    usable = offer.host_usable_bytes_per_node
    if terms.host_bytes_at(b) * g <= usable:
        return b
    if whole or ctx.pinned_micro_batch is not None:
        return 0
    for d in reversed(divisors(per_gpu)):
        if d < b and terms.host_bytes_at(d) * g <= usable and ctx.fits_gpu(
                peak_bytes_int(terms, d, per_gpu), offer.usable_bytes):
            return d
    return 0


def offloads(choice: Choice) -> bool:
    """Whether a choice moves anything to the host (ZeRO/FSDP offload or activation offload): a group is all
    or none of these (SearchContext.groups), and its tight bound adds their least transfer time."""
    return choice.config.offload != Offload.NONE or choice.config.activation_offload


def _arithmetic(members: list[Choice]) -> Choice:
    """The member whose arithmetic bounds a group's: one without the chunked loss (its head computes
    less), else any (they all chunk)."""
    return next((c for c in members if not c.config.chunked_loss), members[0])


def _bound_seconds(ctx: SearchContext, offer: Offer, layout: Layout, members: list[Choice], per_gpu: int, *,
                   tight: bool) -> float:
    """A lower bound on the step seconds of every member of a group (one precision and checkpointing) on
    `layout`: the compute every member runs (the lowest learned factor of the precision) at the best
    micro-batch the layout allows, c ≥ c₀, plus what of the smallest gradient exchange any engine needs
    (V seconds: a ring all-reduce of 16-bit gradients for mixed precision, 32-bit otherwise; ZeRO-2/3
    and FSDP move at least as much) cannot hide. Collectives hide behind at most 5/3 of the compute
    (every micro-step, and 2/3 of one more for a per-step all-reduce) and leave at least MIN_EXPOSED of
    themselves, so a step takes at least c + max(V − 5c/3, m V), whose least value over c ≥ c₀ is
    max(c₀, (1 − m) V / (5/3)) + m V. `tight` adds the least parameter traffic and optimizer step of the
    members to c₀ and their least offload time to the step (what the search checks a group against when
    it visits it; the loose bound, which orders the visit, is shared by every group of one arithmetic)."""
    choice = _arithmetic(members)
    if offer.speed.peak_flops(choice.config.precision) <= 0:
        return float("inf")
    tt = ctx.time(choice, layout)
    b = ctx.pinned_micro_batch or per_gpu
    traffic = ctx.least_traffic_bytes(members, layout, b) if tight else 0.0
    compute = tt.compute_seconds(offer.speed, b, floor=True, floor_traffic_bytes=traffic)
    offload = 0.0
    if tight and offloads(choice):  # a group offloads all or none (SearchContext.groups)
        offload = ctx.least_offload_seconds(members, layout, b, offer.speed)
    n = layout.world_size
    if n == 1:
        return compute + offload
    grad_bytes = 2.0 if choice.config.precision != Precision.FP32 else 4.0
    volume = 2 * (n - 1) / n * ctx.trainable(choice) * grad_bytes
    comm = volume * ring_seconds_per_byte(n, layout.gpus_per_node, offer.speed)
    return max(compute, (1 - MIN_EXPOSED) * comm / HIDING_WINDOWS) + MIN_EXPOSED * comm + offload


@dataclass(frozen=True, slots=True)
class PreparedOffer:
    """An offer with its (layout, group) lower bounds sorted, ready to search."""

    offer: Offer
    failures: OfferFailures
    bounds: list[tuple[float, int, int, Layout, tuple[int, ...], list[Choice]]]

    @property
    def lowest_bound(self) -> float:
        return self.bounds[0][0] if self.bounds else float("inf")


def best_on_offer(ctx: SearchContext, offer: Offer, choices: Sequence[Choice]) -> OfferOutcome:
    """The best candidate on `offer` under the job's objective and limits."""
    return search_offer(ctx, prepare_offer(ctx, offer, choices))


def prepare_offer(ctx: SearchContext, offer: Offer, choices: Sequence[Choice]) -> PreparedOffer:
    """Layouts and groups of an offer with their lower bounds, in visit order."""
    failures = OfferFailures(offer)
    lacks, single, multi = _offer_groups(ctx, offer, choices)
    if lacks:
        failures.lacks = lacks
    layouts = [lay for lay in offer.layouts(ctx.max_nodes) if ctx.per_gpu(lay.world_size) is not None]
    failures.layouts_tried = len(layouts)
    if ctx.pinned_micro_batch is not None:
        layouts = [lay for lay in layouts if ctx.accumulation(lay.world_size, ctx.pinned_micro_batch) is not None]
        failures.pinned_micro_batch_layouts = len(layouts)
    if ctx.max_cost_per_hour is not None:
        over = [lay for lay in layouts if lay.price_per_hour > ctx.max_cost_per_hour]
        if over:
            failures.note_price(min(lay.price_per_hour for lay in over))
        layouts = [lay for lay in layouts if lay.price_per_hour <= ctx.max_cost_per_hour]
    bounds: list[tuple[float, int, int, Layout, tuple[int, ...], list[Choice]]] = []
    single_arithmetic = [_arithmetic(members).config for _, members in single]
    multi_arithmetic = [_arithmetic(members).config for _, members in multi]
    for li, layout in enumerate(layouts):
        per_gpu = ctx.samples_per_gpu(layout.world_size)
        groups = single if layout.world_size == 1 else multi
        for gi, (group_ranks, members) in enumerate(groups):
            c = (single_arithmetic if layout.world_size == 1 else multi_arithmetic)[gi]
            key = (c.precision, c.activation_checkpointing, c.peft, c.chunked_loss, layout.world_size,
                   layout.gpus_per_node, offer.speed)
            seconds = ctx.bound_cache.get(key)
            if seconds is None:
                seconds = ctx.bound_cache[key] = _bound_seconds(ctx, offer, layout, members, per_gpu, tight=False)
            writes = ctx.bound_write_seconds(offer, layout, members)
            hours = ctx.expected_hours(offer, layout, seconds, writes)  # non-decreasing in both: still a bound
            if hours == float("inf"):
                failures.note_interruptions(layout.world_size)  # no member would finish between interruptions
                continue
            bound = hours if ctx.minimize == Minimize.TIME else hours * layout.price_per_hour
            bounds.append((bound, li, gi, layout, group_ranks, members))
    bounds.sort(key=lambda item: item[:3])
    return PreparedOffer(offer, failures, bounds)


def search_offer(ctx: SearchContext, prepared: PreparedOffer, *, cutoff: Key | None = None) -> OfferOutcome:
    """Branch and bound over a prepared offer. Only candidates whose key is at most `cutoff` are sought
    (a pool that cannot enter the ranking need not be solved); None finds the best."""
    offer, failures = prepared.offer, prepared.failures
    best: Candidate | None = None
    best_key = cutoff
    minimize = ctx.minimize
    # Choices that fit at the largest micro-batch allowed, by (rank, layout): their chunked-loss twins
    # run the same step with more head compute at a micro-batch no larger, and their activation-offload twins
    # the same step plus the PCIe copies; both lose every tie.
    whole: set[tuple[int, int]] = set()
    for bound, li, _, layout, group_ranks, members in prepared.bounds:
        price = layout.price_per_hour
        hours = bound if minimize == Minimize.TIME else bound / price if price > 0 else 0.0
        lower = bound_key(minimize, hours, price, layout.world_size, min(group_ranks))
        if best_key is not None and lower[0] > best_key[0]:
            break  # groups come in bound order: every later one is in a higher tier
        if _beyond(lower, best_key):
            continue
        if best_key is not None and (offloads(members[0])
                                     or lower[0] >= best_key[0] - TIGHTEN_WITHIN_TIERS):
            # A tighter bound, computed only for the groups visited and only where it may tell: the
            # engine traffic it adds is a few percent of a step (the offload time may be anything).
            hours = _tight_hours(ctx, offer, layout, members)
            lower = bound_key(minimize, hours, price, layout.world_size, min(group_ranks))
            if _beyond(lower, best_key):
                continue
        group_key = (group_ranks, layout.world_size)
        known = ctx.group_min_cache.get(group_key)
        if known is not None and not ctx.fits_gpu(known[0], offer.usable_bytes):
            # No member fits even at the smallest micro-batch (learned on a pool with no more memory).
            failures.note_memory(known[0], known[1], layout.world_size, ctx.min_peak_micro_batch(known[1], layout))
            _note_lean_on_gpu(ctx, failures, members, layout)
            continue
        eight_bit_results: dict[int, Candidate | None] = {}
        memory_failed_twins: set[int] = set()
        twins_share_terms = not ctx.corrections.by_family  # measured peaks may scale twins differently
        twin_ranks = ctx.twin_ranks(members)
        all_out_of_memory = True
        largest = ctx.pinned_micro_batch or ctx.samples_per_gpu(layout.world_size)
        for choice in members:
            if (choice.unchunked_rank, li) in whole or (choice.kept_rank, li) in whole:
                all_out_of_memory = False
                continue
            key = choice.twin_id
            if not choice.config.optimizer8bit and twins_share_terms and key in eight_bit_results:
                twin = eight_bit_results[key]
                all_out_of_memory = all_out_of_memory and key in memory_failed_twins
                candidate = None if twin is None else _as_32bit(ctx, offer, choice, twin, layout)
            else:
                # An 8-bit choice is pruned only where its 32-bit twin (preferred, never cheaper) would be.
                rank = twin_ranks[key] if choice.config.optimizer8bit and twins_share_terms else choice.rank
                if _beyond((lower[0], lower[1], lower[2], rank), best_key):
                    all_out_of_memory = False  # not known: it cannot win on preference, so it is not evaluated
                    continue
                candidate, out_of_memory = _evaluate(ctx, offer, layout, choice, failures, best_key, rank=rank)
                all_out_of_memory = all_out_of_memory and out_of_memory
                if choice.config.optimizer8bit:
                    eight_bit_results[key] = candidate
                    if out_of_memory:
                        memory_failed_twins.add(key)
            if candidate is not None and candidate.strategy.config.micro_batch_size == largest:
                whole.add((choice.rank, li))
            if candidate is not None and _better(candidate, best, minimize):
                best = candidate
                best_key = search_key(candidate, minimize)
        if all_out_of_memory and known is None and cutoff is None:
            computed = [c for c in members if ctx.has_min_peak(c, layout)]
            leanest = min(computed, key=lambda c: (ctx.min_peak(c, layout), c.rank))
            ctx.group_min_cache[group_key] = (ctx.min_peak(leanest, layout), leanest)
    return OfferOutcome(best, failures)


def _tight_hours(ctx: SearchContext, offer: Offer, layout: Layout, members: list[Choice]) -> float:
    """Expected hours of the tight bound on a group's step (`_bound_seconds`), cached per group and layout."""
    key = (id(members), layout.world_size, layout.gpus_per_node, offer.speed)
    seconds = ctx.tight_bound_cache.get(key)
    if seconds is None:
        per_gpu = ctx.samples_per_gpu(layout.world_size)
        seconds = ctx.tight_bound_cache[key] = _bound_seconds(ctx, offer, layout, members, per_gpu, tight=True)
    return ctx.expected_hours(offer, layout, seconds, ctx.bound_write_seconds(offer, layout, members))


def search_key(c: Candidate, minimize: Minimize) -> Key:
    """What the search prunes against: the part of `objective_key` a lower bound can be compared with."""
    key = objective_key(c, minimize)
    return (key[0], key[1], int(key[2]), int(key[3]))


def any_fit(ctx: SearchContext, prepared: PreparedOffer) -> bool:
    """Whether anything fits the offer at all (leanest configurations and largest layouts first).
    When nothing does, every configuration has been tried and the failures are complete."""
    offer, failures = prepared.offer, prepared.failures
    order = sorted(prepared.bounds, key=lambda item: -item[3].world_size)
    for _, _, _, layout, group_ranks, members in order:
        group_key = (group_ranks, layout.world_size)
        known = ctx.group_min_cache.get(group_key)
        if known is not None and not ctx.fits_gpu(known[0], offer.usable_bytes):  # as search_offer does
            failures.note_memory(known[0], known[1], layout.world_size, ctx.min_peak_micro_batch(known[1], layout))
            _note_lean_on_gpu(ctx, failures, members, layout)
            continue
        ordered = sorted(members, key=lambda c: (ctx.min_peak(c, layout), c.rank))
        for i, choice in enumerate(ordered):
            candidate, out_of_memory = _evaluate(ctx, offer, layout, choice, failures, None)
            if candidate is not None:
                return True
            if out_of_memory:
                # The rest have smallest peaks at least as large: none fits either. What the failures
                # keep of them is the leanest without offload (the leanest of all is this one).
                _note_lean_on_gpu(ctx, failures, ordered[i + 1:], layout)
                if i == 0:
                    ctx.group_min_cache[group_key] = (ctx.min_peak(choice, layout), choice)
                break
    return False


def _note_lean_on_gpu(ctx: SearchContext, failures: OfferFailures, members: list[Choice], layout: Layout) -> None:
    """Also record the leanest configuration that moves nothing to the host (the reason may need it)."""
    on_gpu = [c for c in members if not offloads(c) and ctx.has_min_peak(c, layout)]
    if on_gpu:
        lean = min(on_gpu, key=lambda c: (ctx.min_peak(c, layout), c.rank))
        failures.note_memory(ctx.min_peak(lean, layout), lean, layout.world_size,
                             ctx.min_peak_micro_batch(lean, layout))


def _as_32bit(ctx: SearchContext, offer: Offer, choice: Choice, eight_bit: Candidate | None,
              layout: Layout) -> Candidate | None:
    """The 32-bit twin of an evaluated 8-bit candidate: the same compute with a longer optimizer step
    (four times the state bytes), more memory and larger checkpoints, so it is no better unless it fits
    at the same micro-batch (then it costs its longer step and extra writes, and wins ties on
    preference): expected hours never fall as step or write time grows (planner.interruptions)."""
    if eight_bit is None:
        return None
    b = eight_bit.strategy.config.micro_batch_size
    per_gpu = ctx.samples_per_gpu(layout.world_size)
    terms = ctx.memory(choice, layout.world_size, layout.gpus_per_node)
    if not ctx.fits_gpu(peak_bytes_int(terms, b, per_gpu), eight_bit.usable_bytes):
        return None
    step = ctx.time(choice, layout).step_seconds(offer.speed, b)
    hours = ctx.expected_hours(offer, layout, step.step_seconds, ctx.write_seconds(offer, layout, choice))
    if hours == float("inf") or (ctx.deadline_hours is not None and hours > ctx.deadline_hours):
        return None
    strategy = eight_bit.strategy.with_config(optimizer8bit=False)
    return replace(eight_bit, strategy=strategy, memory=terms.at(b, per_gpu // b), rank=choice.rank, step=step,
                   hours=hours, total_cost=hours * eight_bit.price_per_hour)


def _fits_at_smallest(ctx: SearchContext, offer: Offer, layout: Layout, choice: Choice,
                      failures: OfferFailures) -> bool:
    smallest_peak = ctx.min_peak(choice, layout)
    if ctx.fits_gpu(smallest_peak, offer.usable_bytes):
        return True
    failures.note_memory(smallest_peak, choice, layout.world_size, ctx.min_peak_micro_batch(choice, layout))
    return False


def _evaluate(ctx: SearchContext, offer: Offer, layout: Layout, choice: Choice,
              failures: OfferFailures, best_key: Key | None, *, rank: int | None = None,
              ) -> tuple[Candidate | None, bool]:
    """The candidate of `choice` on `layout` (None when it does not fit, breaks a limit or loses to
    `best_key` even with preference `rank`, default its own), and whether it is out of GPU memory even
    at the smallest micro-batch."""
    n, g = layout.world_size, layout.gpus_per_node
    per_gpu = ctx.samples_per_gpu(n)
    # Cheapest test first: a known smallest peak (or nothing to prune against yet) -> memory first.
    memory_first = best_key is None or ctx.has_min_peak(choice, layout)
    rank = choice.rank if rank is None else rank
    if memory_first and not _fits_at_smallest(ctx, offer, layout, choice, failures):
        return None, True
    tt = ctx.time(choice, layout)
    optimistic_b = ctx.pinned_micro_batch or per_gpu
    optimistic = tt.step_seconds(offer.speed, optimistic_b)
    writes = ctx.write_seconds(offer, layout, choice)
    price = layout.price_per_hour
    if _beyond(bound_key(ctx.minimize, ctx.expected_hours(offer, layout, optimistic.step_seconds, writes), price, n,
                         rank), best_key):
        return None, False
    if not memory_first and not _fits_at_smallest(ctx, offer, layout, choice, failures):
        return None, True
    terms = ctx.memory(choice, n, g)
    b = _micro_batch(ctx, terms, per_gpu, offer.usable_bytes, whole=choice.config.optimizer_in_backward)
    if b and choice.config.activation_offload:
        b = _host_micro_batch(ctx, terms, per_gpu, b, offer, g, whole=choice.config.optimizer_in_backward)
        if not b:
            failures.note_host(terms.host_bytes_at(1) * g, choice, n)
            return None, False
    host_needed = terms.host_bytes_at(b) * g
    if offloads(choice) and host_needed > offer.host_usable_bytes_per_node:
        failures.note_host(host_needed, choice, n)
        return None, False
    nvme_needed = terms.nvme_bytes * g
    if nvme_needed > offer.nvme_bytes_per_node:
        failures.note_nvme(nvme_needed, choice, n)
        return None, False
    step = optimistic if b == optimistic_b else tt.step_seconds(offer.speed, b)
    hours = ctx.expected_hours(offer, layout, step.step_seconds, writes)
    if hours == float("inf"):
        failures.note_interruptions(n)
        return None, False
    if ctx.deadline_hours is not None and hours > ctx.deadline_hours:
        failures.note_deadline(hours, choice, n)
        return None, False
    if _beyond(bound_key(ctx.minimize, hours, price, n, rank), best_key):
        return None, False
    accumulation = ctx.accumulation(n, b)
    assert accumulation is not None, f"micro-batch {b} does not divide {per_gpu} samples per GPU"
    strategy = choice.strategy(optimizer=ctx.optimizer, world_size=n, gpus_per_node=g,
                               micro_batch_size=b, accumulation_steps=accumulation, adapter=ctx.adapter)
    candidate = Candidate(
        pool=offer.pool,
        product=offer.product,
        strategy=strategy,
        nodes=layout.nodes,
        usable_bytes=offer.usable_bytes,
        headroom_percent=ctx.headroom_percent,
        memory=terms.at(b, accumulation),
        step=step,
        price_per_hour=layout.price_per_hour,
        hours=hours,
        total_cost=hours * layout.price_per_hour,
        rank=choice.rank,
        shared_node=layout.shared_node,
    )
    return candidate, False
