"""Turns bench_train_gpt2 --json files into a bench/RESULTS.md section and
bench/results.jsonl rows (one per workload, metric and peer), so a device
call's figures are recorded the same way every time.

Rows per workload and peer: `tokens_per_s` (ratio = ours / peer) and
`fwd_bwd_ms`, the forward+loss plus backward device time from the phase
marks (ratio = peer / ours: above 1 means we are faster).

  bench_train_rows.py --bench moe_train --commit SHA --machine TEXT --title TEXT
                      --command TEXT --md OUT.md --jsonl OUT.jsonl FILE.json...
"""
import argparse
import datetime
import json


def fwd_bwd_ms(result):
    phases = result.get("phases_device_ms") or {}
    if "forward+loss" not in phases or "backward" not in phases:
        return None
    return phases["forward+loss"] + phases["backward"]


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--bench", "--commit", "--machine", "--title", "--command", "--md", "--jsonl"):
        ap.add_argument(flag, required=True)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = [f"## {args.bench} ({args.title}) — {date}", "",
          f"machine: {args.machine}; commit {args.commit}", f"command: `{args.command}`", ""]
    md.append("| workload | impl | tok/s | ms/step | fwd+bwd ms | MFU (active params) | peak GiB | colossus tok/s ÷ impl | first-loss check |")
    md.append("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for path in args.files:
        with open(path) as f:
            run = json.load(f)
        workload, ours = run["workload"], run["colossus"]
        check = run.get("loss_check") or {}
        check_text = (f"{check['max_rel_diff']:.1e} vs {check['reference']} ({'pass' if check['pass'] else 'FAIL'})"
                      if "max_rel_diff" in check else "n/a")
        entries = [("colossus", "colossus (bf16 + fp32 masters, HybridAdam)", ours)]
        entries += [(variant, peer.get("impl", variant), peer) for variant, peer in sorted(run["peers"].items())]
        for variant, impl, r in entries:
            fb = fwd_bwd_ms(r)
            ratio = "" if variant == "colossus" else f"{ours['tokens_per_s'] / r['tokens_per_s']:.2f}"
            md.append(f"| {workload} | {impl} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.1f} | "
                      f"{'' if fb is None else f'{fb:.1f}'} | {100 * r.get('mfu', 0):.1f}% | "
                      f"{r.get('peak_allocated_gib', 0):.1f} | {ratio} | {check_text if variant == 'colossus' else ''} |")
            if variant == "colossus":
                continue
            base = {"date": date, "commit": args.commit, "machine": args.machine, "bench": args.bench,
                    "config": workload, "peer": variant}
            rows.append({**base, "metric": "tokens_per_s", "value": ours["tokens_per_s"],
                         "peer_value": r["tokens_per_s"], "ratio": ours["tokens_per_s"] / r["tokens_per_s"]})
            ours_fb = fwd_bwd_ms(ours)
            if fb is not None and ours_fb is not None:
                rows.append({**base, "metric": "fwd_bwd_ms", "value": ours_fb, "peer_value": fb,
                             "ratio": fb / ours_fb})
    md.append("")
    with open(args.md, "w") as f:
        f.write("\n".join(md) + "\n")
    with open(args.jsonl, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
