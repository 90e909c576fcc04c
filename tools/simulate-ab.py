#!/usr/bin/env python3
"""Two builds of `kvtrace simulate` side by side over random configurations.

A change to how the simulation runs (steps of quiet passes, event order, caches) must leave
every result as it was. This runs both builds on the same random configurations and
compares each report (its timing keys left out) and every `--report-jsonl` line, to the
byte. The configurations are drawn from a seed: the bundled slice of Mooncake's conversation
trace and the delta, agentic and Weka samples, and synthetic sessions; the three engines
under both references' schedulers, one to three workers and ranks, pools from too small for
some prompts to roomy, `max_num_seqs`, both routers, open and closed loops, arrivals sped
up; aggregated and disaggregated (one to three workers a pool, transfers instant to slow,
whole-prompt and missing-only). A configuration both builds refuse counts apart; one only
one build refuses is a difference.

Usage: tools/simulate-ab.py OLD NEW [--seed N] [--count N] [--jobs N]
Prints each differing configuration's arguments and a summary; exit status 1 when any
differs. About 0.1 s a configuration on one core.
"""
import argparse, json, os, random, subprocess, sys, tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
T = os.path.join(ROOT, "testdata")
TRACES = [
    [os.path.join(T, "mooncake", "conversation_head300.jsonl")],
    [os.path.join(T, "traces", "mooncake_delta.jsonl"), "--trace-format", "mooncake-delta",
     "--trace-block-size", "64"],
    [os.path.join(T, "traces", "agentic_v2.jsonl"), "--trace-format", "agentic_mooncake"],
    [os.path.join(T, "traces", "weka_sample.jsonl"), "--trace-format", "weka"],
]
# What varies in the report with the machine, not with the run (the keys
# tools/simulate-vs-aisimulate.sh leaves out too).
TIMING = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}


def engine(rng, engine_type, version, page, kind):
    e = {"block_size": page, "engine_type": engine_type, "engine_version": version}
    if kind:
        e["worker_type"] = kind
    blocks = rng.choice([None, 300, 1000, 3000, 12000])
    if blocks:
        e["num_gpu_blocks"] = blocks * 64 // page
    dp = rng.choice([1, 1, 2, 3])
    if dp > 1:
        e["dp_size"] = dp
    if rng.random() < 0.3:
        e["max_num_seqs"] = rng.choice([2, 6, 16])
    if kind == "prefill":
        bandwidth = rng.choice([None, None, 2.0, 0.5, 20.0])
        if bandwidth:
            e["kv_transfer_bandwidth"] = bandwidth
            e["kv_bytes_per_token"] = 131072
        if rng.random() < 0.3:
            e["kv_transfer_timing_mode"] = "destination_missing"
    if engine_type == "vllm" and version == "aisimulate-0.13" and rng.random() < 0.2:
        e["prefill_schedule_interval"] = rng.choice([2, 3])
    return e


def configuration(rng):
    engine_type = rng.choice(["vllm", "trtllm", "sglang"])
    disaggregated = rng.random() < 0.5
    # Dynamo 1.4.2 refuses disaggregated TRT-LLM.
    version = rng.choice(["aisimulate-0.13", "dynamo-1.4.2"])
    if disaggregated and engine_type == "trtllm":
        version = "aisimulate-0.13"
    page = rng.choice([16, 32, 64, 512])
    trace = rng.choice([0, 0, 1, 2, 3, None])
    if trace is None:
        args = ["--input-tokens", rng.choice(["500", "2000"]),
                "--output-tokens", rng.choice(["5", "200"]), "--request-count", "150",
                "--turns-per-session", rng.choice(["1", "3"]),
                "--inter-turn-delay-ms", rng.choice(["0", "50"])]
    else:
        args = list(TRACES[trace])
        args += ["--arrival-speedup-ratio", rng.choice(["1", "3", "20"])]
    if disaggregated:
        args += ["--num-prefill-workers", str(rng.choice([1, 2, 3])),
                 "--num-decode-workers", str(rng.choice([1, 2, 3])),
                 "--prefill-engine-args",
                 json.dumps(engine(rng, engine_type, version, page, "prefill")),
                 "--decode-engine-args",
                 json.dumps(engine(rng, engine_type, version, page, "decode"))]
    else:
        args += ["--num-workers", str(rng.choice([1, 2, 3, 4])), "--extra-engine-args",
                 json.dumps(engine(rng, engine_type, version, page, None))]
    args += ["--router-mode", rng.choice(["round_robin", "kv_router"])]
    # An agentic trace's requests wait on one another, not on a slot.
    concurrency = rng.choice([None, None, "2", "6", "20"])
    if concurrency and trace not in (2, 3):
        args += ["--replay-concurrency", concurrency]
    elif trace is None:
        args += ["--request-rate", rng.choice(["5", "20"])]
    return args


def run(binary, args, work):
    report, lines = os.path.join(work, "r.json"), os.path.join(work, "r.jsonl")
    done = subprocess.run([binary, "simulate", *args, "-q", "--report-json", report,
                           "--report-jsonl", lines], stderr=subprocess.PIPE)
    if done.returncode != 0:
        return ("refused", done.returncode)
    with open(report) as f:
        r = json.load(f)
    for key in TIMING:
        r.pop(key, None)
    with open(lines) as f:
        return (r, f.read())


def compare(old, new, args):
    with tempfile.TemporaryDirectory() as work:
        a, b = run(old, args, work), run(new, args, work)
    if a[0] == "refused" and b[0] == "refused":
        return "refused"
    return "same" if a == b else "differs"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--count", type=int, default=500)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    o = p.parse_args()
    rng = random.Random(o.seed)
    configurations = [configuration(rng) for _ in range(o.count)]
    counts = {"same": 0, "differs": 0, "refused": 0}
    with ThreadPoolExecutor(o.jobs) as pool:
        for args, verdict in zip(configurations,
                                 pool.map(lambda a: compare(o.old, o.new, a), configurations)):
            counts[verdict] += 1
            if verdict == "differs":
                print("differs:", json.dumps(args), flush=True)
    print(f"{o.count} configurations (seed {o.seed}): {counts['same']} the same, "
          f"{counts['differs']} differ, {counts['refused']} refused by both")
    sys.exit(1 if counts["differs"] else 0)


if __name__ == "__main__":
    main()
