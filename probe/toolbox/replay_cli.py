"""``probe replay DIR``: rerun captured API calls for accuracy and timing.

Exit status: 0 when every check passed (or only timing was asked), 1 when a check failed,
2 on bad input.
"""
import os

from probe.cli_options import add_device_option, add_registry_option, require_device
from probe.errors import ConfigError


def add_arguments(parser):
    parser.add_argument("dir", help="an OpCapture output folder (or autocompare's failed/ folder)")
    add_device_option(parser, help="device to replay on")
    parser.add_argument("--times", type=int, default=1, help="timed runs per call, after one warm-up (default 1)")
    parser.add_argument("--forward-only", action="store_true", help="skip the backward replay")
    parser.add_argument("--check", action="store_true", help="accuracy: vs saved outputs/grads and a CPU golden")
    parser.add_argument("--time", action="store_true", help="time forward and backward")
    parser.add_argument("--ops", default=None, help="comma-separated API names or regexes to replay")
    add_registry_option(parser)
    parser.add_argument("--verbose", action="store_true", help="print every check, not only failures")


def run(args):
    from probe.toolbox.base import NameFilter
    from probe.toolbox.options import parse_list
    from probe.toolbox.replay import Replayer, find_calls

    if not os.path.isdir(args.dir):
        raise ConfigError(f"no such folder: {args.dir}")
    require_device(args.device)
    if args.times < 1:
        raise ConfigError("--times must be >= 1")
    check = args.check or not args.time
    calls = find_calls(args.dir)
    if not calls:
        raise ConfigError(f"no captured calls (meta.json) under {args.dir}")
    flt = NameFilter(parse_list(args.ops), None, default_exclude=frozenset()) if args.ops else None
    rp = Replayer(device=args.device, times=args.times, forward_only=args.forward_only,
                  check=check, timing=args.time, yaml_path=args.wrap_ops_yaml)
    failed = 0
    print(f"{'call':<40} {'status':<8} {'fwd ms':>9} {'bwd ms':>9}  details")
    import json
    if flt is not None:
        def api(folder):
            with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
                return json.load(f).get("name", "")
        calls = [c for c in calls if flt.wants(api(c))]
    for folder in calls:
        try:
            res = rp.replay(folder)
        except Exception as exc:  # one broken folder must not hide the others
            print(f"{os.path.relpath(folder, args.dir):<40} {'error':<8} {'-':>9} {'-':>9}  {type(exc).__name__}: {exc}")
            failed += 1
            continue
        failed += res["status"] == "fail"
        bad = [c for c in res["checks"] if c["status"] == "fail"]
        shown = res["checks"] if args.verbose else bad
        detail = res["note"] or "; ".join(
            f"{c['what']}: {c['status']} max_abs={_f(c.get('max_abs'))} max_rel={_f(c.get('max_rel'))}"
            + (f" ({c['note']})" if c.get("note") else "") for c in shown) or \
            f"{len(res['checks'])} checks passed" if check else ""
        print(f"{res['name'] + '.' + str(res['call_id']):<40} {res['status']:<8} {_f(res['forward_ms']):>9} "
              f"{_f(res['backward_ms']):>9}  {detail}")
    print(f"probe replay: {len(calls)} calls, {failed} failed")
    return 1 if failed else 0


def _f(x):
    return "-" if x is None else f"{x:.4g}"
