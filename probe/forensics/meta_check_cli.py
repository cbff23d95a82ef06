"""``probe meta-check SCRIPT [args...]``: run a script with every API call meta-checked.

Exit status: 0 no mismatch, 1 mismatches found (see meta_check.json), and the script's
own exit status (or 1) when the script fails.
"""
import argparse
import sys
import traceback

from probe.cli_options import add_output_option, add_registry_option


def add_arguments(parser):
    add_output_option(parser, default="meta_check.json", help="report path")
    add_registry_option(parser)
    parser.add_argument("--no-stride", action="store_true", help="compare dtype and shape only")
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")


def run(args):
    from probe.forensics.meta_check import run_script
    try:
        check = run_script(args.script, args.script_args, out=args.output,
                           wrap_ops_yaml=args.wrap_ops_yaml, check_stride=not args.no_stride)
    except SystemExit as exc:
        print(f"probe meta-check: {args.script} exited with {exc.code}; report in {args.output}", file=sys.stderr)
        return exc.code if isinstance(exc.code, int) else 1
    except Exception:
        traceback.print_exc()
        print(f"probe meta-check: {args.script} raised; report so far in {args.output}", file=sys.stderr)
        return 1
    report = check.report()
    n = len(report["mismatches"])
    print(f"probe meta-check: {report['checked_calls']} calls checked, {n} mismatch(es), "
          f"{len(report['meta_errors'])} meta error(s); report: {args.output}")
    return 1 if n else 0
