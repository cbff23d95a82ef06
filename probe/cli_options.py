"""Options the ``probe`` commands share, defined once: the same spelling, aliases (msprobe's
included), check and help everywhere. Standard library only: ``--help`` imports no torch.

    def add_arguments(parser):
        add_device_option(parser)
        add_output_option(parser, dest="out", default=".", help="report folder")
"""
import re

from probe.errors import ConfigError

_DEVICE = re.compile(r"^(cpu|cuda|npu)(:\d+)?$")


def device(value):
    """argparse type: ``cpu``, ``cuda[:N]`` or ``npu[:N]``."""
    value = str(value).strip()
    if not _DEVICE.match(value):
        import argparse
        raise argparse.ArgumentTypeError(f"{value!r}: use cpu, cuda[:N] or npu[:N]")
    return value


def add_device_option(parser, default="cpu", help="device to run on"):
    """``--device`` / ``-d``: cpu, cuda[:N] or npu[:N]."""
    parser.add_argument("--device", "-d", type=device, default=default, metavar="DEVICE",
                        help=f"{help}: cpu, cuda[:N] or npu[:N] (default {default})")


def require_device(value):
    """Raise ValueError (the commands' one-line error) unless ``value`` (``cpu``, ``cuda[:N]``,
    ``npu[:N]``) can be used in this process.

    ``torch.npu`` exists only once ``torch_npu`` has been imported: a training script does
    that itself, a ``probe`` command run from a shell has not, so it is imported here; a
    check of ``torch.npu`` alone refused every NPU."""
    import torch
    kind = value.split(":", 1)[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {value}: no CUDA device available")
    if kind == "npu":
        try:
            import torch_npu  # noqa: F401 - registers torch.npu and the device type
        except ImportError:
            raise ConfigError(f"--device {value}: torch_npu is not installed") from None
        npu = getattr(torch, "npu", None)
        if npu is None or not npu.is_available():
            raise ConfigError(f"--device {value}: no NPU available")


def add_output_option(parser, default=None, dest="output", help="output path"):
    """``-o`` / ``--output`` / ``--out``."""
    parser.add_argument("-o", "--output", "--out", dest=dest, default=default,
                        help=help if default is None or "(default" in help else f"{help} (default {default})")


def add_registry_option(parser):
    """``--wrap-ops-yaml`` (msprobe's ``--wrap_ops_yaml``; ``--yaml``): the API registry."""
    parser.add_argument("--wrap-ops-yaml", "--wrap_ops_yaml", "--yaml", dest="wrap_ops_yaml", default=None,
                        metavar="YAML", help="API registry (default: the packaged support_wrap_ops.yaml)")
