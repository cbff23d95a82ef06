"""Type stub of the C extension ``_cstack.c`` (a stack's identity in one call)."""
from types import FrameType
from typing import Optional

def frame_key(frame: FrameType) -> Optional[bytes]:
    """Bytes naming the (code, instruction) of ``frame`` and every frame below it."""
