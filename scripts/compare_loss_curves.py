"""Compare two `colossus train` loss curves (metrics.jsonl), e.g. FP8 against
bf16 from the same seed and data (issue 28: "a 500-step loss curve within 1%
of bf16's").

Single-step losses of two runs that differ in arithmetic part by batch noise
amplified through training, so the curves are compared as means over windows
of --window steps: the table gives each window's mean loss for both runs and
their relative difference; the verdict is the largest difference after the
first window (the first steps are the same loss of random weights in both).
Tokens/s are the medians of the steps after the first window.

  python3 scripts/compare_loss_curves.py REF/metrics.jsonl RUN/metrics.jsonl
          [--window 50] [--tolerance 0.01] [--labels bf16,fp8]

Exits 1 when the largest windowed difference exceeds --tolerance, 2 when a
file has no training records, the two runs have different step counts or
there is only one window.
"""
import argparse
import json
import statistics
import sys


def read_steps(path):
    steps = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if "loss" in record:
                steps[record["step"]] = record
    return [steps[k] for k in sorted(steps)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference")
    parser.add_argument("run")
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--tolerance", type=float, default=0.01)
    parser.add_argument("--labels", default="reference,run")
    args = parser.parse_args()
    if args.window < 1:
        sys.exit(f"--window {args.window}: must be >= 1")
    labels = args.labels.split(",")
    if len(labels) != 2:
        sys.exit(f"--labels '{args.labels}': give two names, comma-separated")
    ref, run = read_steps(args.reference), read_steps(args.run)
    if not ref or not run:
        print(f"no training records in {args.reference if not ref else args.run}")
        return 2
    if len(ref) != len(run):
        print(f"{labels[0]} has {len(ref)} steps, {labels[1]} {len(run)}: not the same run length")
        return 2
    if len(ref) <= args.window:
        print(f"{len(ref)} steps make one window of {args.window}: nothing to compare after the first window")
        return 2

    print(f"| steps | {labels[0]} mean loss | {labels[1]} mean loss | relative difference |")
    print("|---|---|---|---|")
    worst, worst_at = 0.0, ""
    for begin in range(0, len(ref), args.window):
        end = min(begin + args.window, len(ref))
        a = statistics.fmean(r["loss"] for r in ref[begin:end])
        b = statistics.fmean(r["loss"] for r in run[begin:end])
        diff = abs(b - a) / abs(a)
        span = f"{ref[begin]['step']}-{ref[end - 1]['step']}"
        print(f"| {span} | {a:.4f} | {b:.4f} | {diff:.2e} |")
        if begin > 0 and diff > worst:
            worst, worst_at = diff, span
    late = slice(args.window, None)
    speed_a = statistics.median(r["tokens_per_s"] for r in ref[late])
    speed_b = statistics.median(r["tokens_per_s"] for r in run[late])
    print(f"\ntokens/s (median after step {args.window}): {labels[0]} {speed_a:,.0f}, {labels[1]} {speed_b:,.0f} "
          f"= {speed_b / speed_a:.2f}x")
    verdict = "PASS" if worst <= args.tolerance else "FAIL"
    print(f"largest windowed loss difference after the first window: {worst:.2e} (steps {worst_at}), "
          f"tolerance {args.tolerance:g}: {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
