"""What differs between the Python versions probe supports (3.9-3.13), in one place.

Only the standard library is imported here: the compare runs without torch.

    from probe.python_compat import SLOTS, READS_BYTECODE
    @dataclass(**SLOTS)          # slots from Python 3.10 on
"""
import sys

# The Pythons whose instructions probe reads, by opcode name through ``dis``: to name an
# operator as msprobe does (``a + b`` is ``Tensor.__add__``, hook_module/operators.py) and
# to record arguments as written (dump/call_site.py). On any other Python both fall back:
# operators are named as the method they run (``Tensor.add``) and arguments are recorded
# in torch's dispatch form, said once in the log.
BYTECODE_PYTHONS = ((3, 9), (3, 10), (3, 11), (3, 12), (3, 13))
READS_BYTECODE = sys.version_info[:2] in BYTECODE_PYTHONS

# dataclass(slots=True) came with Python 3.10; on 3.9 the records are plain classes
SLOTS = {"slots": True} if sys.version_info >= (3, 10) else {}
