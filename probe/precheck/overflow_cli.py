"""``probe overflow``: the first API that produced Inf/NaN from finite inputs in a dump.

Exit status: 0 when no overflow was found, 1 when one was, 2 on bad input.
"""


def add_arguments(parser):
    parser.add_argument("dump", help="a dump.json, a rank folder or a dump root (step*/rank*/)")
    parser.add_argument("-n", "--max", type=int, default=10,
                        help="list at most this many overflow origins (default 10, 0: all)")


def run(args) -> int:
    from probe.precheck.overflow import find_overflow
    report = find_overflow(args.dump)
    for p in report.problems:
        print(f"probe overflow: warning: {p}")
    if not report.hits:
        print(f"no overflow: {report.scanned} entries in {len(report.dumps)} dump(s) hold no Inf/NaN "
              f"that finite inputs produced")
        return 0
    first = report.first
    print(f"first overflow: {first}")
    shown = report.hits[1:] if args.max == 0 else report.hits[1:args.max]
    for hit in shown:
        print(f"  then: {hit}")
    rest = len(report.hits) - 1 - len(shown)
    if rest > 0:
        print(f"  ... {rest} more")
    print(f"{len(report.passed_on)} entries only passed Inf/NaN on from their inputs")
    return 1
