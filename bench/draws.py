"""What recording random draws costs the NPU side: a dumped training step of a GPT-2 with
dropout, with draw recording on and off.

    python bench/draws.py [--task statistics] [--d 64] [--layers 2] [--seq 16] [--batch 2] [--blocks 12] [--block 8]
                          [--rounds 3] [--dir /dev/shm] [--null]

The model is tests/test_draw_replay.py's: the tiny HF GPT-2 of tests/real_runs.py with
resid/embd/attn dropout 0.1, eager attention, AdamW, in train mode. One debugger dumps
every step; recording is switched on and off in blocks of ``--block`` steps, in pairs of
blocks taken in turn on-off and off-on (the interceptor's handler is the draw handler, or
the chain behind it as when nothing is recorded: a switch for this measurement only), so
that a machine whose speed drifts slows both alike (with on always first, a process
getting faster showed recording off 0.3-0.5 ms faster than itself). The first step of a block is not timed (it follows a step of the other
setting). Per round: the median step time on and off, and
the median of the differences of a block's steps and the previous block's; the dump's own
time is the median dumped step (recording off) minus the median step of the same loop
without a debugger. Two clocks: wall time, and the training thread's CPU time (steadier on
a shared machine; it leaves out the helper thread that makes the draws file ahead). Prints
the round with the smallest dump time (the quietest machine), the median share over the
rounds and every round's.
A measurement, not a test.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def model_and_batches(args):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=128, n_positions=args.seq, n_embd=args.d, n_layer=args.layers, n_head=4,
                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg).train()
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 128, (args.batch, args.seq), generator=g) for _ in range(4)]
    return model, batches


CLOCKS = {"wall": time.perf_counter, "training-thread CPU": time.thread_time}


def block_steps(args, dumped):
    """Per clock, times of the timed steps of ``args.blocks`` pairs of blocks: (recording
    on, off), in matching order; for the loop without a debugger, (times, times)."""
    from probe import PrecisionDebugger
    model, batches = model_and_batches(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    folder = tempfile.mkdtemp(prefix="probe_bench_draws_", dir=args.dir)
    dbg = PrecisionDebugger(dump_path=folder, task=args.task, level="L1") if dumped else None
    recorder = dbg._draws.recorder if dbg else None
    times = {c: ([], []) for c in CLOCKS}
    n = 2 * args.block * (args.blocks + 1)
    try:
        for i in range(n):
            block, k = divmod(i, args.block)
            pair, second = divmod(block, 2)
            recording = second == pair % 2   # on-off, off-on, on-off, ...: a drifting speed cancels out
            if dbg and k == 0:   # the switch: the draw handler in front of the chain, or not
                on = recording and not args.null
                dbg._interceptor.handler = dbg._draws if on else dbg.forensics
                dbg._draws.recorder = recorder if on else None
            x = batches[i % len(batches)]
            t = {c: clock() for c, clock in CLOCKS.items()}
            if dbg:
                dbg.start()
            opt.zero_grad()
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            if dbg:
                dbg.stop()
                dbg.step()
            if block >= 2 and k > 0:   # two blocks of warm-up
                for c, clock in CLOCKS.items():
                    times[c][0 if recording else 1].append(clock() - t[c])
        if dbg and not args.null:
            assert os.path.exists(os.path.join(folder, "step1", "rank", "draws.safetensors")), "no draws recorded"
            assert not os.path.exists(os.path.join(folder, f"step{args.block + 1}", "rank", "draws.safetensors")), \
                "recorded when off"
    finally:
        if dbg:
            dbg.close()
        shutil.rmtree(folder, ignore_errors=True)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="statistics", choices=("statistics", "tensor"))
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=12, help="pairs of blocks (on, off) timed")
    ap.add_argument("--block", type=int, default=8, help="steps a block")
    ap.add_argument("--dir", default=None, help="where the dumps go (default: the temp folder)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--null", action="store_true", help="recording off in both blocks: the method's noise floor")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    med = statistics.median
    rounds = {c: [] for c in CLOCKS}
    for _ in range(args.rounds):
        plain = block_steps(args, dumped=False)
        dumped = block_steps(args, dumped=True)
        for c in CLOCKS:
            on, off = dumped[c]
            base = med(plain[c][0])
            rounds[c].append((med(off) - base, base, med(off), med(on), med(a - b for a, b in zip(on, off))))
    print(f"GPT-2 d={args.d} layers={args.layers} seq={args.seq} batch={args.batch} dropout 0.1, task {args.task}, "
          f"torch {torch.__version__}, {args.threads} thread(s), dumps in {args.dir or tempfile.gettempdir()}, "
          f"{args.blocks} x {args.block - 1} step pairs a round, {args.rounds} rounds")
    for c in CLOCKS:
        dump, plain, off, on, added = min(rounds[c])   # the quietest round: the smallest dump time
        print(f"{c} (the quietest round):")
        print(f"  no dump            {plain * 1e3:8.2f} ms/step")
        print(f"  recording off      {off * 1e3:8.2f} ms/step   (the dump's own time {dump * 1e3:.2f} ms)")
        print(f"  recording on       {on * 1e3:8.2f} ms/step")
        print(f"  recording adds {added * 1e3:+.3f} ms a dumped step (median of paired steps): "
              f"{added / off * 100:+.1f}% of the dumped step, {added / dump * 100:+.1f}% of the dump's own time")
        shares = [r[4] / r[0] * 100 for r in rounds[c]]
        print(f"  median of the rounds: {statistics.median(shares):+.1f}% of the dump's own time; every round: "
              + ", ".join(f"{x:+.1f}% of {r[0] * 1e3:.1f} ms" for x, r in zip(shares, rounds[c])))


if __name__ == "__main__":
    main()
