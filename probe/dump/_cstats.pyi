"""Type stub of the C extension ``_cstats.c`` (tensor statistics in one pass)."""
from typing import Any, Dict, List, Optional, Tuple

KIND_F32: int
KIND_F64: int
KIND_BF16: int
KIND_F16: int
KIND_I64: int
KIND_I32: int
KIND_I16: int
KIND_I8: int
KIND_U8: int
KIND_BOOL: int

def summarize(address: int, numel: int, kind: int) -> Tuple[Any, Any, Any, Any]:
    """(Max, Min, Mean, Norm) of a contiguous CPU buffer."""
def summarize_rows(address: int, rows: int, cols: int, kind: int) -> List[List[float]]:
    """One [Max, Min, Mean, Norm] per row of a contiguous CPU buffer of a floating kind."""
def summary(tensor: Any, cache: Dict[Any, Any], token_shape: Optional[Tuple[int, ...]] = None) -> Optional[Dict[str, Any]]:
    """dump.json summary dict of a plain contiguous CPU tensor, else None; with ``token_shape``,
    an inference tensor of a floating dtype whose leading dims are it gets "token_stats" too."""
def setup(plain_types: Tuple[Any, ...], kinds: Dict[Any, int], dtype_names: Dict[Any, str], strided: Any) -> None:
    """The torch objects summary() needs."""
