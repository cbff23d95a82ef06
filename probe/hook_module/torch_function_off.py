"""The one context under which probe's own tensor work runs.

Statistics, detaches, copies and hooks made by probe go past every
``__torch_function__``: past probe's own mode (a patched operator's hook runs under it;
~40 pass-through calls per API otherwise), and past the user's modes and tensor
subclasses, which must not see probe's work. ``torch._C.DisableTorchFunction`` is a C
context manager: entering it costs ~0.1 us.
"""
import torch

no_function_mode = torch._C.DisableTorchFunction
