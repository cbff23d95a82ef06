"""The ``probe`` command line.

Each sub-command lives in its own module, which provides ``add_arguments(parser)``
and ``run(args) -> int``; the module is imported only when its command is used, so
``probe --help`` stays fast (no torch import).
"""
import argparse
import importlib
import sys

from probe.errors import ConfigError

# What a command raises for a user's mistake: a ConfigError (ValueError's subclass that
# names the bad value), or a file or folder that is missing, already there, of the wrong kind
# or unreadable.
INPUT_ERRORS = (ConfigError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
                PermissionError)

# name -> (module, one-line help)
COMMANDS = {
    "init": ("probe.init_config", "write an editable config.json and support_wrap_ops.yaml"),
    "demo": ("probe.demo_cli", "dump a small model as bf16 'NPU' and fp32 'bench' runs and compare them"),
    "compare": ("probe.compare.cli", "compare an NPU dump with a bench dump: an HTML page, xlsx, csv "
                                     "and compare_summary json"),
    "check-ranks": ("probe.compare.check_ranks_cli",
                    "find ranks whose collective results differ from the other ranks' (one run, no bench)"),
    "run-ut": ("probe.precheck.run_ut_cli", "pre-check every dumped API against a float64 golden on a trusted device"),
    "overflow": ("probe.precheck.overflow_cli", "find the first API that produced Inf/NaN in a dump"),
    "repro": ("probe.forensics.repro_cli", "write a standalone script that reruns one dumped API call"),
    "meta-check": ("probe.forensics.meta_check_cli", "run a script checking meta (fake) inference against real outputs"),
    "replay": ("probe.toolbox.replay_cli", "rerun captured API calls (OpCapture) for accuracy and timing"),
}


def _top_parser():
    parser = argparse.ArgumentParser(
        prog="probe", description="Precision debugging for PyTorch training.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {n:<12} {h}" for n, (_, h) in COMMANDS.items()))
    parser.add_argument("--version", action="store_true", help="print probe's version and exit")
    parser.add_argument("command", choices=sorted(COMMANDS), metavar="command",
                        help="one of the commands below; 'probe COMMAND -h' for its options")
    return parser


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        from probe import __version__
        print(f"probe {__version__}")
        return 0
    if not argv:                       # no command: the help, and the status of a usage error
        _top_parser().print_help(sys.stderr)
        return 2
    if argv[0] not in COMMANDS:
        _top_parser().parse_args(argv)   # --help exits 0; anything else is a usage error (exit 2)
        return 2
    name = argv[0]
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"probe {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    try:
        return int(module.run(args) or 0)
    except INPUT_ERRORS as exc:
        # The user's mistake (a bad option, config or input file, a path that is not there):
        # one clear line, no traceback. Anything else is probe's own bug and keeps its traceback.
        print(f"probe {name}: error: {exc}", file=sys.stderr)
        return 2


def console_main():
    """The ``probe`` program (and ``python -m probe``): ``main``, then the process ends
    (at once where the command kept what it held: process_end)."""
    from probe import process_end
    process_end.ENDING = True
    process_end.end(main())


if __name__ == "__main__":
    console_main()
