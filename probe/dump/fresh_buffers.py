"""Buffers allocated uninitialised (``torch.empty``, ``new_empty``, ``empty_like``) and not
yet written: their contents are whatever memory held, not data.

vLLM's attention allocates its output with ``torch.empty``, views it, and hands the view to
the kernel that fills it in place. Recorded as an input, the garbage differs from run to run
(1.5e32 against 3e-41) and the compare blames it as "inputs differ". A buffer stays fresh
until a recorded call writes it (an in-place API, an ``out=`` argument, a custom op's
``Tensor(a!)`` argument); until then it, and every view of it, is recorded without values
(``"uninitialized": true``), which the compare has nothing to compare in.

Buffers are told apart by their storage, so a view of one is one too. Each storage keeps weak
references to the tensors seen over it (the allocation, its views as they are recorded: vLLM
rebinds ``output = output.view(...)``, dropping the allocation); while one lives, the address
cannot have been reused by a later allocation.
"""
import weakref

import torch

ALLOCATORS = (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty,
              torch.Tensor.new_empty_strided)


def _storage_key(t):
    try:
        return t.untyped_storage().data_ptr()
    except Exception:   # no storage (a fake or sparse tensor): never fresh
        return None


class FreshBuffers:
    """The step's uninitialised buffers, by storage address."""

    def __init__(self):
        self._by_storage = {}   # storage address -> weakrefs to the tensors seen over it

    def __bool__(self):
        return bool(self._by_storage)

    def clear(self):
        self._by_storage.clear()

    def allocated(self, out):
        """Called with an allocator's result (``ALLOCATORS``)."""
        if isinstance(out, torch.Tensor) and out.numel():
            key = _storage_key(out)
            if key:
                self._by_storage[key] = [weakref.ref(out)]

    def holds(self, t):
        """Is ``t`` (or the buffer it views) allocated and not written since?"""
        key = _storage_key(t)
        refs = self._by_storage.get(key)
        if refs is None:
            return False
        alive = [r for r in refs if r() is not None]
        if not alive:   # the buffer is gone: its address may hold another tensor now
            del self._by_storage[key]
            return False
        if not any(r() is t for r in alive):
            alive.append(weakref.ref(t))   # a view: it may outlive the allocation
        self._by_storage[key] = alive
        return True

    def written(self, value):
        """``value`` (a tensor or a list of them) was just written by a call: data now."""
        if not self._by_storage:
            return
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(t, torch.Tensor):
                self._by_storage.pop(_storage_key(t), None)
