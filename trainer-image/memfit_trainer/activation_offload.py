"""Activation offload: every tensor a transformer block saves for backward is copied to host memory when it is
saved and copied back when backward needs it (torch.autograd.graph.saved_tensors_hooks), so between forward
and backward the device holds no block activations. The technique of torchtune's `OffloadActivations`
(`enable_activation_offloading`) and of `torch.autograd.graph.save_on_cpu`, with their rules:

- only tensors of at least MIN_BYTES (torchtune's `min_offload_size`, 1 KiB) move;
- parameters, views of them and autocast's cached 16-bit copies of them stay: they are not activations, the
  device keeps them anyway, and moving them would copy every weight twice per step;
- the hooks are active inside each block's forward only (a forward pre-hook enters them, a forward hook
  leaves them): the head and the loss keep their tensors, which backward needs first, and a block recomputed
  in backward (activation checkpointing) keeps its recomputed working set on the device. Checkpointing's own
  hooks sit inside the block's forward, so under `full` only the saved block inputs move, and under
  `selective-op` the matmul outputs torch's selective checkpointing caches itself stay.

On CUDA the host copies are pinned and both copies are asynchronous to the host (`non_blocking`) on the
compute stream, which orders them with the kernels that produce and consume the tensors (torchtune overlaps
them on a side stream; this does not, and the step-time model counts the transfers as exposed). On a CPU the
"host" is a NumPy buffer: memory outside torch's CPU allocator, so the allocator meter (memfit_trainer.meters)
measures what stays on the device exactly as it would on a GPU, and `peak_host_bytes` what went to the host.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

MIN_BYTES = 1024
OFFLOADED_ATTR = "memfit_activation_offload"  # set on the model whose blocks offload (runner facts read it)


def is_weight(tensor: torch.Tensor) -> bool:
    """A parameter, a view of one, or autocast's cached 16-bit copy of one (a copy whose autograd input is a
    leaf)."""
    base = tensor._base if tensor._base is not None else tensor
    if isinstance(tensor, nn.Parameter) or isinstance(base, nn.Parameter):
        return True
    if base.is_leaf and base.requires_grad:
        return True
    node = base.grad_fn
    if node is None or type(node).__name__ != "ToCopyBackward0":
        return False
    return any(n is not None and type(n).__name__ == "AccumulateGrad" for n, _ in node.next_functions)


class _HostCopy:
    """One saved tensor in host memory, and how to bring it back. A tensor that spans its whole storage is copied
    as that storage's bytes and restored with its own view (`as_strided`), so that two views of one storage saved
    in one block (SDPA's output and the output projection's input) share one host copy, as they share one block
    on the device."""

    __slots__ = ("device", "dtype", "host", "keep", "nbytes", "offset", "owner", "shape", "stride")

    def __init__(self, owner: ActivationOffload, tensor: torch.Tensor, *, whole: bool) -> None:
        self.owner, self.device, self.dtype = owner, tensor.device, tensor.dtype
        if whole:
            source = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
            self.shape, self.stride, self.offset = tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()
        else:
            source = tensor.contiguous().view(-1).view(torch.uint8) if tensor.dtype != torch.bool else (
                tensor.contiguous().view(-1).to(torch.uint8))
            self.shape, self.stride, self.offset = tuple(tensor.shape), None, 0
        self.nbytes = source.numel()
        if tensor.device.type == "cuda":
            self.host = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True)
            self.host.copy_(source, non_blocking=True)
            self.keep: np.ndarray | None = None
        else:
            # Outside torch's allocator: the NumPy buffer is the host, torch's CPU allocator the device.
            self.keep = np.empty(self.nbytes, dtype=np.uint8)
            self.host = torch.from_numpy(self.keep)
            self.host.copy_(source)
        owner.note(self.nbytes)

    def view_of(self, tensor: torch.Tensor) -> _HostCopy:
        """Another view of the storage this copy holds."""
        twin = object.__new__(_HostCopy)
        twin.owner, twin.device, twin.dtype, twin.host, twin.keep, twin.nbytes = (
            self.owner, self.device, tensor.dtype, self.host, self.keep, 0)
        twin.shape, twin.stride, twin.offset = tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()
        return twin

    def restore(self) -> torch.Tensor:
        on_device = torch.empty(self.host.shape, dtype=torch.uint8, device=self.device)
        on_device.copy_(self.host, non_blocking=self.device.type == "cuda")
        if self.dtype == torch.bool and self.stride is None:
            return on_device.to(torch.bool).view(self.shape)
        typed = on_device.view(self.dtype)
        if self.stride is None:
            return typed.view(self.shape)
        return typed.as_strided(self.shape, self.stride, self.offset)

    def __del__(self) -> None:
        if self.nbytes:
            self.owner.note(-self.nbytes)


class ActivationOffload:
    """Saved-tensor hooks around each block's forward; counts the host bytes it holds."""

    def __init__(self, *, min_bytes: int = MIN_BYTES) -> None:
        self.min_bytes = min_bytes
        self.host_bytes = 0
        self.peak_host_bytes = 0
        self.tensors_offloaded = 0
        self._active: list[Any] = []
        self._seen: list[dict[int, tuple[_HostCopy, Any]]] = []
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def note(self, nbytes: int) -> None:
        self.host_bytes += nbytes
        self.peak_host_bytes = max(self.peak_host_bytes, self.host_bytes)

    def _pack(self, tensor: torch.Tensor) -> Any:
        if tensor.numel() * tensor.element_size() < self.min_bytes or tensor.layout != torch.strided or is_weight(tensor):
            return tensor
        self.tensors_offloaded += 1
        storage = tensor.untyped_storage()
        if tensor.dtype == torch.bool or tensor.numel() * tensor.element_size() != storage.nbytes():
            return _HostCopy(self, tensor, whole=False)
        # A whole storage: shared with the other views of it saved in this block (the block's `seen` holds the
        # storage until the block's forward ends, so its address cannot be reused by another tensor meanwhile).
        seen = self._seen[-1] if self._seen else None
        found = seen.get(storage.data_ptr()) if seen is not None else None
        if found is not None:
            return found[0].view_of(tensor)
        copy = _HostCopy(self, tensor, whole=True)
        if seen is not None:
            seen[storage.data_ptr()] = (copy, storage)
        return copy

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.restore() if isinstance(packed, _HostCopy) else packed

    def _enter(self, module: nn.Module, args: Any) -> None:
        # A block re-run inside backward (reentrant recomputation) keeps its tensors: it is not a forward.
        if torch._C._current_graph_task_id() != -1:
            self._active.append(None)
            return
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._active.append(hooks)
        self._seen.append({})

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        hooks = self._active.pop() if self._active else None
        if hooks is not None:
            hooks.__exit__(None, None, None)
            self._seen.pop()

    def attach(self, blocks: Iterable[nn.Module]) -> int:
        """Hook every block; the number hooked."""
        count = 0
        for block in blocks:
            self._handles.append(block.register_forward_pre_hook(self._enter))
            self._handles.append(block.register_forward_hook(self._leave, always_call=True))
            count += 1
        return count

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def apply_activation_offload(model: nn.Module, blocks: Iterable[nn.Module]) -> ActivationOffload:
    """Offload the saved activations of `blocks` (the problem's transformer blocks) of `model`; ValueError when
    there are none to hook."""
    offload = ActivationOffload()
    if offload.attach(blocks) == 0:
        raise ValueError("strategy.activationOffload: the problem declares no blocks to offload; disable it")
    setattr(model, OFFLOADED_ATTR, offload)
    return offload


def activation_offload_of(model: nn.Module) -> ActivationOffload | None:
    """The model's activation offload, if its blocks offload."""
    found = getattr(model, OFFLOADED_ATTR, None)
    return found if isinstance(found, ActivationOffload) else None
