#!/usr/bin/env python3
"""What-if accuracy of `kvtrace replay` against real LMCache servers.

For every recording A in a what-if directory (default ../shared/lmcache/whatif) and every
server B of the same workload (same seed and client), replays A with B's L1 size and policy
and compares each request's hits with the chunks B's client got (B.client.txt). The truth
is the client log, read here, never anything kvtrace computes.

Usage: tools/whatif-accuracy.py [--kvtrace PATH] [--dir DIR] [-- extra replay flags...]
Prints one row per (A, B): requests exact, hit rate of the truth and of the replay, and
their difference in percentage points.
"""
import argparse, csv, os, re, subprocess, sys, tempfile
from pathlib import Path

NAME = re.compile(r"^(?P<work>.+)_(?P<size>\d+p\d+)_(?P<policy>[a-z]+)(?P<rest>.*)$")


def client(path):
    requested, got = [], []
    for line in path.read_text().splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "CLIENT" and f[1] == "retrieve":
            requested.append(int(f[2]))
            got.append(int(f[3]))
    return requested, got


def replay(kv, trace, size, policy, extra, out):
    cmd = [kv, "replay", str(trace), "--l1-size-gb", size, "--eviction-policy", policy,
           "--output-dir", out, *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(Path(out) / "trace_replay_requests.csv") as f:
        return [int(r["hit_chunks"]) for r in csv.DictReader(f)]


def main():
    ap = argparse.ArgumentParser()
    root = Path(__file__).resolve().parent.parent
    ap.add_argument("--kvtrace", default=str(root / "target/release/kvtrace"))
    ap.add_argument("--dir", default=str(root.parent / "shared/lmcache/whatif"))
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    runs = {}
    for lct in sorted(Path(a.dir).glob("*.lct")):
        m = NAME.match(lct.stem)
        if not m or not lct.with_suffix(".client.txt").exists():
            continue
        runs[lct.stem] = (m, lct)
    print(f"{'recording':28} {'predicting':28} {'exact':>9} {'truth %':>8} {'replay %':>8} {'pp':>7}")
    worst, exact_all, n_all = 0.0, 0, 0
    for a_name, (am, a_lct) in runs.items():
        for b_name, (bm, b_lct) in runs.items():
            if (am["work"], am["rest"]) != (bm["work"], bm["rest"]):
                continue
            size = bm["size"].replace("p", ".")
            requested, truth = client(b_lct.with_suffix(".client.txt"))
            with tempfile.TemporaryDirectory() as out:
                got = replay(a.kvtrace, a_lct, size, bm["policy"].upper(), a.extra, out)
            if len(got) != len(truth):
                print(f"{a_name:28} {b_name:28} request counts differ: {len(got)} vs {len(truth)}")
                continue
            exact = sum(g == t for g, t in zip(got, truth))
            tot = sum(requested)
            tp, rp = 100 * sum(truth) / tot, 100 * sum(got) / tot
            worst = max(worst, abs(rp - tp))
            exact_all += exact
            n_all += len(truth)
            print(f"{a_name:28} {b_name:28} {exact:>4}/{len(truth):<4} {tp:8.2f} {rp:8.2f} {rp - tp:+7.2f}")
    print(f"all: {exact_all}/{n_all} requests exact ({100 * exact_all / max(n_all, 1):.2f} %), worst {worst:.2f} pp")


if __name__ == "__main__":
    main()
