"""``probe repro DUMP_DIR --api NAME [--device cpu|cuda|npu] [-o FILE]``: one API call as a script."""
import os

from probe.forensics.repro import DEVICES, generate


def add_arguments(parser):
    parser.add_argument("dump_dir", help="a dump root, step or rank dir, dump.json, or a crash dump folder "
                                         "({dump_path}/exception/{entry})")
    parser.add_argument("--api", required=True,
                        help="entry name, e.g. Functional.linear.0.forward or Functional.linear.0.backward")
    parser.add_argument("--device", default="cpu", choices=DEVICES, help="device the script runs the API on")
    parser.add_argument("-o", "--output", default=None, help="script path (default ./repro_{entry}.py); "
                                                             "the inputs go next to it as .pt")


def run(args):
    path = generate(args.dump_dir, args.api, device=args.device, output=args.output)
    print(f"wrote {path} and {os.path.splitext(path)[0]}.pt; run: python3 {path}")
    return 0
