"""Turning intercepted calls into dump files: statistics, stacks, records, the writer."""
