"""``probe compare``: msprobe's ``-i compare.json`` form, or ``--npu/--bench`` paths."""
from __future__ import annotations

import os
import sys
from probe.errors import ConfigError
from probe.untrusted import read_json

from .options import Analysis, CompareOptions, Matching, Output

DEFAULT_OUTPUT = os.path.join(".", "compare_out")


def add_arguments(parser) -> None:
    parser.add_argument("-i", "--input_path", "--input-path", help="compare.json with npu_json_path, bench_json_path "
                        "(and stack_json_path); msprobe's npu_path/bench_path also accepted")
    parser.add_argument("--npu", help="NPU side: a dump.json, a rank dir or a dump root")
    parser.add_argument("--bench", help="bench side: a dump.json, a rank dir or a dump root")
    parser.add_argument("-o", "--output_path", "--output-path", "--output", "--out", dest="output_path",
                        default=None, help=f"folder for the results (default {DEFAULT_OUTPUT})")
    parser.add_argument("-s", "--stack_mode", "--stack-mode", action="store_true", help="add NPU_Stack_Info")
    parser.add_argument("-f", "--fuzzy_match", "--fuzzy-match", action="store_true",
                        help="ignore call counters, pair calls of each API by order")
    parser.add_argument("--align", choices=("auto", "on", "off"), default="auto",
                        help="align the two call sequences: when they differ (auto), always, "
                             "or never (pair by name, as msprobe)")
    parser.add_argument("--bench2", help="a second bench dump of the same program (a dump.json, "
                        "or a dump root paired by step/rank): run-to-run noise per API, so "
                        "nondeterminism is not blamed")
    parser.add_argument("--no-replay", dest="replay", action="store_false", default=None,
                        help="tensor dumps: judge calls by their jump instead of re-running each "
                             "differing call on the NPU side's own inputs (faster, less exact)")
    parser.add_argument("--scheduler", metavar="ADDRESS", help="dump roots: compare the pairs on "
                        "this Dask cluster (tcp://host:8786; needs probe[dask] and the dumps on a "
                        "shared file system) instead of local processes")
    parser.add_argument("--processes", type=int, help="dump roots: local worker processes "
                        "(default: one per core, at most one per pair)")
    parser.add_argument("--no-html", action="store_true", help="do not write compare_report_*.html")
    parser.add_argument("--layer-mapping", "--layer_mapping", "-lm", dest="layer_mapping", metavar="FILE",
                        help="inference roots: which module rows of the NPU run are which of the bench's, a "
                        "JSON/YAML file (a vLLM run against transformers; docs/inference.md)")
    parser.add_argument("--layout", metavar="FILE", help="dump roots with another number of ranks on each "
                        "side (TP/FSDP against one device): how plain tensors are sharded, a JSON/YAML "
                        "file of row-name pattern -> {\"shard_dim\": D} | {\"partial\": \"sum\"} | "
                        "{\"replicate\": true} (DTensors record their own layout)")


def run(args) -> int:
    from .reader import gc_paused
    # No cyclic collection for the whole command, not only inside compare_pair: re-enabled
    # there while the results are still held, the first collection walked millions of small
    # acyclic objects (~0.6 s on the 100k-entry pair of bench/compare.py). Restored on
    # return, by when they are gone: a caller of ``probe.cli.main`` keeps its collector.
    with gc_paused():
        return _run(args)


def options_of(args) -> CompareOptions:
    """The compare options the command line gives."""
    return CompareOptions(
        Matching(fuzzy_match=args.fuzzy_match,
                 align={"auto": None, "on": True, "off": False}[getattr(args, "align", "auto")]),
        Analysis(auto_analyze=True, replay=getattr(args, "replay", None)),
        Output(stack_mode=args.stack_mode, html=not getattr(args, "no_html", False)))


def _no_mapping(args) -> None:
    if getattr(args, "layer_mapping", None):
        raise ConfigError(f"--layer-mapping {args.layer_mapping}: applies to two inference dump roots (steps with "
                          "token_layout.json), not to one pair of dumps")


def _run(args) -> int:
    from .entry_points import compare, compare_distributed, param_path
    if args.input_path and (args.npu or args.bench):
        given = " and ".join(f"--{k} {v}" for k, v in (("npu", args.npu), ("bench", args.bench)) if v)
        raise ConfigError(f"-i {args.input_path} and {given} both name the dumps: give -i compare.json, "
                         "or --npu PATH and --bench PATH, not both")
    if not args.input_path and bool(args.npu) != bool(args.bench):
        missing = "--bench" if args.npu else "--npu"
        raise ConfigError(f"{missing} PATH is missing: give --npu PATH and --bench PATH, or -i compare.json")
    defaulted = args.output_path is None
    if defaulted:
        args.output_path = DEFAULT_OUTPUT
    options = options_of(args)
    bench2 = getattr(args, "bench2", None)
    run_kw: dict = {"options": options, "bench2_dir": bench2, "scheduler": getattr(args, "scheduler", None),
              "processes": getattr(args, "processes", None), "layout": getattr(args, "layout", None)}
    if getattr(args, "layer_mapping", None):
        run_kw["layer_mapping"] = args.layer_mapping
    if args.input_path:
        if not os.path.isfile(args.input_path):
            raise FileNotFoundError(f"compare.json not found: {args.input_path}")
        param = read_json(args.input_path, "compare.json")
        if not isinstance(param, dict):
            raise ConfigError(f"{args.input_path}: compare.json must be an object with npu_json_path and "
                              f"bench_json_path, got {type(param).__name__}")
        npu = param_path(param, "npu_json_path", "npu_path")
        bench = param_path(param, "bench_json_path", "bench_path")
        if npu and bench and os.path.isdir(npu) and os.path.isdir(bench):
            run_kw["bench2_dir"] = bench2 or param_path(param, "bench2_json_path", "bench2_path")
            paths = compare_distributed(npu, bench, args.output_path, **run_kw)
        else:
            _no_mapping(args)
            if bench2:
                param["bench2_json_path"] = bench2
            paths = compare(param, args.output_path, options=options)
    elif args.npu and args.bench:
        for p in (args.npu, args.bench):
            if not os.path.exists(p):
                raise FileNotFoundError(f"no such dump: {p}")
        from .dump_tree import find_dumps
        from .tokens import is_inference_root
        npu, bench = find_dumps(args.npu), find_dumps(args.bench)
        inference = is_inference_root(args.npu) and is_inference_root(args.bench)
        if len(npu) == 1 and len(bench) == 1 and not inference:   # two dump.json files or rank dirs: one pair
            _no_mapping(args)
            if bench2:
                b2 = find_dumps(bench2)
                if len(b2) != 1:
                    raise ConfigError(f"--bench2 {bench2}: one dump expected for one pair, found {len(b2)}")
                bench2 = next(iter(b2.values()))
            paths = compare({"npu_json_path": next(iter(npu.values())),
                             "bench_json_path": next(iter(bench.values())),
                             "bench2_json_path": bench2, "is_print_compare_log": True},
                            args.output_path, options=options)
        else:
            paths = compare_distributed(args.npu, args.bench, args.output_path, **run_kw)
    else:
        raise ConfigError("give -i compare.json, or --npu PATH and --bench PATH")
    for p in paths:
        print(p)
    print(f"probe compare: wrote {len(paths)} files to {os.path.abspath(args.output_path)}"
          + (" (no -o given: the default folder)" if defaulted else ""), file=sys.stderr)
    return 0
