"""``probe run-ut``: pre-check every API of a dump on a trusted device.

Exit status: 0 when no API is an error, 1 when some are, 2 on bad input.
"""
from probe.cli_options import add_device_option, add_output_option


def add_arguments(parser):
    parser.add_argument("-i", "--input", "--api_info", dest="input", required=True,
                        help="dump.json of a tensor (or statistics) dump, or its rank folder")
    add_output_option(parser, dest="out", default=".",
                        help="folder for accuracy_checking_result/details_{ts}.csv")
    add_device_option(parser, help="bench device")
    parser.add_argument("--white-list", "--white_list", nargs="+", default=None, metavar="API",
                        help="check only these APIs (linear, Functional.linear, Functional.linear.0)")
    parser.add_argument("--black-list", "--black_list", nargs="+", default=None, metavar="API",
                        help="skip these APIs")
    parser.add_argument("--resume", "--continue", action="store_true",
                        help="continue the newest result CSV in the output folder")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for the replays (default 1: fastest for dumped-size tensors; 0: torch's default)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    from probe.precheck import run_ut
    result = run_ut(args.input, out_dir=args.out, device=args.device, white_list=args.white_list,
                    black_list=args.black_list, resume=args.resume,
                    progress=False if args.no_progress else None,
                    threads=args.threads or None)
    for p in result.problems:
        print(f"probe run-ut: warning: {p}")
    print(result.summary_table())
    print(f"{sum(sum(c.values()) for c in result.counts.values())} checks in {result.elapsed:.2f} s")
    errors = sum(c.get("error", 0) for c in result.counts.values())
    return 1 if errors else 0
