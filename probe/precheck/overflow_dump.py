"""Old home of the overflow dumper (README's ``probe.precheck.overflow_dump.OverflowCheck``);
it lives with the other dumpers in ``probe.dump.overflow`` now."""
from probe.dump.overflow import OverflowCheck, OverflowCollector

__all__ = ["OverflowCheck", "OverflowCollector"]
