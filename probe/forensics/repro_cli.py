"""``probe repro DUMP_DIR --api NAME [--device cpu|cuda|npu] [-o FILE]``: one API call as a script."""
import os

from probe.cli_options import add_device_option, add_output_option


def add_arguments(parser):
    parser.add_argument("dump_dir", help="a dump root, step or rank dir, dump.json, or a crash dump folder "
                                         "({dump_path}/exception/{entry})")
    parser.add_argument("--api", required=True,
                        help="entry name, e.g. Functional.linear.0.forward or Functional.linear.0.backward")
    add_device_option(parser, help="device the script runs the API on")
    add_output_option(parser, help="script path (default ./repro_{entry}.py); the inputs go next to it as .pt")


def run(args):
    from probe.forensics.repro import generate
    path = generate(args.dump_dir, args.api, device=args.device, output=args.output)
    print(f"wrote {path} and {os.path.splitext(path)[0]}.pt; run: python3 {path}")
    return 0
