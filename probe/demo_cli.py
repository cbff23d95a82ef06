"""``probe demo``: its options here, its work in ``probe.demo`` (imported to run, so that
``probe demo --help`` imports no torch)."""
from probe.cli_options import add_output_option


def add_arguments(parser):
    add_output_option(parser, default="demo_out", help="output folder")


def run(args):
    from probe.demo import run as run_demo
    return run_demo(args)
