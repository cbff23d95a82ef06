"""``probe.repro.generate(dump_dir, api, device="cpu", output=None)``: a standalone script
that reruns one dumped API call (see :mod:`probe.forensics.repro`)."""
from probe.forensics.repro import generate, load_tensor, parse_entry

__all__ = ["generate", "load_tensor", "parse_entry"]
