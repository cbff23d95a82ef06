"""Type stub of the C++ extension ``_cfloat.cpp`` (the texts of floats, made without the GIL)."""
from typing import Any

import numpy as np

def text(x: float) -> str:
    """One float's text: shortest digits, Ryu's layout; "null" for NaN and infinities."""

def texts(values: list | np.ndarray) -> list[str]:
    """Each value's text: a list of floats, ints and None, or a 1-d float64 array."""

class Block:
    """A float64 m x k array (C order) whose text ``[[a,b],[c,d]]`` is made on first use."""
    def __init__(self, array: np.ndarray) -> None: ...
    def text(self) -> bytes: ...

api: Any
