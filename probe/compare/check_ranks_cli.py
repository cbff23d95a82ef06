"""``probe check-ranks ROOT``: ranks whose collective results differ from the others'.

Exit status 0 when every compared result agrees, 1 when some rank's differs (for CI)."""
from __future__ import annotations

import json
import os
from probe.errors import ConfigError


def add_arguments(parser) -> None:
    parser.add_argument("root", help="one run's dump root (step*/rank*/dump.json)")
    parser.add_argument("--rtol", type=float, default=1e-6,
                        help="statistics agree within this relative difference (default 1e-6; "
                             "md5 is compared exactly)")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")


def run(args) -> int:
    from dataclasses import asdict

    from .check_ranks import check_ranks
    if not os.path.exists(args.root):
        raise FileNotFoundError(f"no such dump root: {args.root}")
    if args.rtol < 0:
        raise ConfigError(f"--rtol must be >= 0, got {args.rtol}")
    report = check_ranks(args.root, rtol=args.rtol)
    for line in report.lines():
        print(line)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(dict(asdict(report), bad_ranks=report.bad_ranks), fh, indent=1)
    return 1 if report.mismatches or report.undecided else 0
