"""Shape-exact training steps without the arithmetic: every allocation happens, the math does not.

On a CPU, one GPT-2-small step at sequence 1024 takes 10 s in fp32 and 23 s in bf16 (2 cores, one
thread), so a profile of several configurations cannot run the real arithmetic in a minute. Memory
does not depend on the values, only on which tensors exist when. Under `ElideCompute`:

- compute-bound operators, those torch's FLOP counter counts (mm, addmm, bmm, baddbmm, attention
  and their backwards), run on the `meta` device to get their outputs' shapes, strides and dtypes;
  the outputs are then allocated for real (zero-filled unless `memory_bound`). Convolutions run for
  real: their kernels allocate workspace through the allocator (im2col, oneDNN scratch), 0.6-2.2 %
  of a small ViT's peak when elided, and a transformer's patch embedding is cheap;
- with `memory_bound=True` (the profiler's CPU default) the same happens to every other `aten`
  operator on a tensor of at least `min_elements` elements: out-of-place ones allocate their outputs
  (left unfilled), in-place ones (`mul_`, `lerp_`, `addcdiv_`, `zero_`...) are skipped, since they
  allocate nothing. Library operators (bitsandbytes) that return tensors and have a meta kernel are
  treated the same way; those that only mutate their inputs run their own kernel under this mode, so
  their internal allocations (bitsandbytes dequantises 8-bit state to fp32 on a CPU) still happen.

Views, operators that return Python values (`.item()`), data-dependent shapes (`nonzero`) and small
tensors (step counters, token ids, labels) run for real, so control flow and indices are unchanged.
What is lost: scratch space a skipped kernel allocates internally (none seen for the builtin
transformers; a few KB with bitsandbytes). Tests compare elided and real steps; the accuracy benchmark compares profiles against
real-compute truth.

Not for models whose allocations depend on values (mixture-of-experts routing, early exit): use
`--compute full` for those. Skipped FLOPs per dtype and skipped bytes are recorded so that step time
can be modelled from measured device rates (timing.py).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten

# Below this many elements an operator runs for real: cheap, and where the values matter (step
# counters, token ids, labels, loss scalars, masks of a few thousand tokens).
MIN_ELIDED_ELEMENTS = 1 << 16

# Operators that always run: they return Python values, have data-dependent output shapes, or change
# a tensor's storage.
REAL_OPS = frozenset(
    {
        aten._local_scalar_dense,
        aten.item,
        aten.equal,
        aten.is_nonzero,
        aten.nonzero,
        aten.masked_select,
        aten._unique2,
        aten.unique_dim,
        aten.unique_consecutive,
        aten.resize_,
        aten.resize_as_,
        aten.set_,
        aten.repeat_interleave,
        aten._assert_async,
        aten.lift_fresh,
        aten.detach,
        aten.alias,
    }
)
# Convolutions keep their real kernels (workspace allocations; see the module docstring).
CONVOLUTION_OPS = frozenset(
    {
        aten.convolution,
        aten.convolution_backward,
        aten._convolution,
        aten._slow_conv2d_forward,
        aten.cudnn_convolution,
        aten.convolution_overrideable,
    }
)
# Operators whose output shapes or indices depend on the values they read: fed elided (garbage)
# values, they steer the model differently from a real step (a top-k router, boolean-mask gathers).
DATA_DEPENDENT_OPS = frozenset(
    {
        aten.nonzero,
        aten.masked_select,
        aten._unique2,
        aten.unique_dim,
        aten.unique_consecutive,
        aten.repeat_interleave,
        aten.topk,
        aten.sort,
        aten.argsort,
        aten.argmax,
        aten.argmin,
        aten.multinomial,
        aten.bincount,
        aten.is_nonzero,
        aten.equal,
    }
)
_DEVICE_KEYS = {"cpu": torch._C.DispatchKey.CPU, "cuda": torch._C.DispatchKey.CUDA}
_SKIP = object()


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


def _bytes(values: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(values) if isinstance(t, torch.Tensor))


def _leaf_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.dtype, value.device.type)
    if isinstance(value, int | float | bool | str | torch.dtype | torch.device | torch.memory_format | None):
        return value
    return repr(value)


class ElideCompute(TorchDispatchMode):
    """Dispatch mode that replaces arithmetic by the allocations it would make."""

    def __init__(self, *, memory_bound: bool = False, min_elements: int = MIN_ELIDED_ELEMENTS) -> None:
        super().__init__()
        self._compute_ops = frozenset(flop_registry) - CONVOLUTION_OPS
        self.memory_bound = memory_bound
        self.min_elements = min_elements
        self.flops_by_dtype: dict[torch.dtype, float] = defaultdict(float)
        self.bytes_touched = 0.0
        self.calls = 0
        self._meta_cache: dict[Any, Any] = {}
        # Taint tracking (`tracking`): storages holding elided values, and the first data-dependent
        # operator that read one (then the step's allocations may differ from a real step's).
        self.tracking = False
        self._tainted: set[int] = set()
        self.data_dependent: str | None = None
        self._in_place: dict[Any, tuple[str, ...] | bool] = {}
        self._static: dict[Any, bool] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.tracking:
            return self._tracked(func, args, kwargs)
        return self._dispatch(func, args, kwargs)

    def track(self, enabled: bool) -> None:
        """Start (or stop) following elided values through the operators that read them."""
        self.tracking = enabled
        self._tainted.clear()
        self.data_dependent = None

    def _tracked(self, func: Any, args: Any, kwargs: Any) -> Any:
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        tainted = any(_storage(t) in self._tainted for t in inputs)
        if tainted and self.data_dependent is None and func._overloadpacket in DATA_DEPENDENT_OPS:
            self.data_dependent = str(func._overloadpacket)
        before = self.calls
        out = self._dispatch(func, args, kwargs)
        if tainted or self.calls != before:  # propagated, or elided just now
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self._tainted.add(_storage(t))
        return out

    def _dispatch(self, func: Any, args: Any, kwargs: Any) -> Any:
        packet = func._overloadpacket
        if packet in self._compute_ops:
            return self._elide_compute(func, packet, args, kwargs)
        if packet in CONVOLUTION_OPS:
            return func(*args, **kwargs)
        if not self.memory_bound or not self._maybe_elidable(func, packet):
            return func(*args, **kwargs)
        leaves, _ = tree_flatten((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        library = func.namespace != "aten"
        if not library and max((t.numel() for t in tensors), default=0) < self.min_elements:
            return func(*args, **kwargs)
        names = self._written(func)
        if names is True:
            return func(*args, **kwargs)
        if names is not False:
            if library:
                return self._run_library_kernel(func, tensors, args, kwargs)
            return self._skip_in_place(func, names, args, kwargs)
        out = self._allocate_outputs(func, leaves, tensors, args, kwargs)
        return func(*args, **kwargs) if out is _SKIP else out

    def take_flops(self) -> tuple[dict[torch.dtype, float], float]:
        """(Elided FLOPs per input dtype, elided bytes touched) since the last call."""
        out = dict(self.flops_by_dtype), self.bytes_touched
        self.flops_by_dtype.clear()
        self.bytes_touched = 0.0
        return out

    def _elide_compute(self, func: Any, packet: Any, args: Any, kwargs: Any) -> Any:
        leaves, _ = tree_flatten((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        out = self._allocate_outputs(func, leaves, tensors, args, kwargs, fill=not self.memory_bound)
        if out is _SKIP:
            return func(*args, **kwargs)
        self.flops_by_dtype[tensors[0].dtype] += float(flop_registry[packet](*args, **kwargs, out_val=out))
        return out

    def _maybe_elidable(self, func: Any, packet: Any) -> bool:
        """Static checks, cached per operator: not a view, not a value- or storage-changing operator."""
        known = self._static.get(func)
        if known is None:
            returns = func._schema.returns
            known = not (
                packet in REAL_OPS
                or func.is_view
                or any(r.alias_info is not None and not r.alias_info.is_write for r in returns)
                or any(a.kwarg_only and a.name == "out" for a in func._schema.arguments)
            )
            if known and func.namespace != "aten":
                # Library operators: those that return tensors need a meta kernel to be elided.
                known = not returns or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "Meta")
            self._static[func] = known
        return known

    def _written(self, func: Any) -> tuple[str, ...] | bool:
        """False for an out-of-place operator; for an in-place one, the argument each return aliases.

        True marks an in-place operator that also returns a fresh tensor (it runs for real).
        """
        if func not in self._in_place:
            schema = func._schema
            written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
            names: tuple[str, ...] | bool = False
            if written:
                sources = []
                for ret in schema.returns:
                    alias = ret.alias_info
                    match = [
                        a.name
                        for a in written
                        if alias is not None and a.alias_info.before_set == alias.before_set
                    ]
                    sources.append(match[0] if match else "")
                names = tuple(sources) if all(sources) else True
            self._in_place[func] = names
        return self._in_place[func]

    def _allocate_outputs(
        self,
        func: Any,
        leaves: list[Any],
        tensors: list[torch.Tensor],
        args: Any,
        kwargs: Any,
        *,
        fill: bool = False,
    ) -> Any:
        key = (func, tuple(_leaf_key(v) for v in leaves), len(args), tuple(kwargs))
        meta_out = self._meta_cache.get(key)
        if meta_out is None:
            meta_kwargs = tree_map(_to_meta, kwargs)
            if "device" in kwargs:
                meta_kwargs["device"] = torch.device("meta")
            try:
                meta_out = func(*tree_map(_to_meta, args), **meta_kwargs)
            except Exception:  # no meta kernel, or a data-dependent shape: run it for real
                meta_out = _SKIP
            if meta_out is not _SKIP and not all(isinstance(v, torch.Tensor) for v in tree_leaves(meta_out)):
                meta_out = _SKIP
            self._meta_cache[key] = meta_out
        if meta_out is _SKIP:
            return _SKIP
        device = tensors[0].device if tensors else torch.device("cpu")
        out = tree_map(lambda v: _materialise(v, device, fill=fill), meta_out)
        self.bytes_touched += _bytes(tensors) + _bytes(out)
        self.calls += 1
        return out

    def _skip_in_place(self, func: Any, names: tuple[str, ...], args: Any, kwargs: Any) -> Any:
        """An in-place operator allocates nothing: return what it would return, unchanged."""
        schema = func._schema
        bound = {a.name: v for a, v in zip(schema.arguments, args, strict=False)} | dict(kwargs)
        if any(n not in bound for n in names):
            return func(*args, **kwargs)
        outs = [bound[n] for n in names]
        self.bytes_touched += 2 * _bytes(args[0] if args else None)
        self.calls += 1
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _run_library_kernel(self, func: Any, tensors: list[torch.Tensor], args: Any, kwargs: Any) -> Any:
        """Run a mutating library operator's own device kernel with this mode active inside it."""
        key = _DEVICE_KEYS.get(tensors[0].device.type) if tensors else None
        if key is None or not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key):
            return func(*args, **kwargs)
        with self:
            return func._op_dk(key, *args, **kwargs)


def _storage(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return 0


def _materialise(value: Any, device: torch.device, *, fill: bool) -> Any:
    if isinstance(value, torch.Tensor):
        out = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)
        return out.zero_() if fill else out
    return value
