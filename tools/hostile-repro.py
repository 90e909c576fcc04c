#!/usr/bin/env python3
"""Re-runs the hostile-user repros of reliability round 3 (issue 30) against a kvtrace binary and
prints, per row, how each run ended: runs, panics, aborts (a signal), hangs (past the time limit),
multi-line errors, and inputs whose bytes changed (data lost).

usage: tools/hostile-repro.py [KVTRACE]      (default: target/release/kvtrace)

Each repro runs in a fresh temporary directory. A run "ends cleanly" when it exits with a status
from kvtrace's documented set (0, 1, 2, 130, 143) without a panic message, within its limit, with
at most one line on stderr when it fails, and every input it was given is byte-for-byte intact.
"""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KVTRACE = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target/release/kvtrace")
SAMPLE = ROOT / "testdata/lmcache/basic_lru.lct"
MOONCAKE = ROOT / "testdata/mooncake/conversation_head300.jsonl"
DOCUMENTED = {0, 1, 2, 130, 143}


def digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if Path(path).exists() else None


class Row:
    def __init__(self, name):
        self.name = name
        self.runs = self.panics = self.aborts = self.hangs = self.multiline = self.lost = 0
        self.notes = []

    def run(self, args, inputs=(), limit=60, expect=None, term_after=None, cwd=None):
        """Runs kvtrace; `inputs` are files that must be intact afterwards; `expect`, when
        given, is the exit status the row's fix promises."""
        before = {p: digest(p) for p in inputs}
        self.runs += 1
        began = time.monotonic()
        proc = subprocess.Popen([KVTRACE, *map(str, args)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=cwd)
        if term_after is not None:
            time.sleep(term_after)
            proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            self.hangs += 1
            self.notes.append(f"hang: {args[:3]}")
            return None
        elapsed = time.monotonic() - began
        err = err.decode(errors="replace")
        code = proc.returncode
        if "panicked" in err:
            self.panics += 1
        if code < 0 or code not in DOCUMENTED:
            self.aborts += 1
            self.notes.append(f"status {code}: {args[:3]}")
        if code != 0 and len(err.strip().splitlines()) > 1:
            self.multiline += 1
            self.notes.append(f"{len(err.strip().splitlines())} lines: {err.strip()[:120]!r}")
        for p, d in before.items():
            if digest(p) != d:
                self.lost += 1
                self.notes.append(f"input changed: {Path(p).name}")
        if expect is not None and code != expect:
            self.notes.append(f"exit {code}, expected {expect}: {' '.join(map(str, args))[:100]}")
        return code, out.decode(errors="replace"), err, elapsed


def copy(src, dst):
    Path(dst).write_bytes(Path(src).read_bytes())
    return Path(dst)


def rank_report(d, rank=0, world=1):
    out = d / f"run{rank}"
    subprocess.run([KVTRACE, "replay", SAMPLE, "-q", "--json", "--no-csv", "--rank", "0",
                    "--world-size", "1", "--output-dir", out], check=True)
    doc = json.loads((out / "rank-00000/trace_replay_summary.json").read_text())
    doc["kvtrace"]["rank"]["rank"] = rank
    doc["kvtrace"]["rank"]["world_size"] = world
    return doc


def long_trace(d, records):
    t = d / "long.lct"
    subprocess.run([KVTRACE, "generate", t, "--records", str(records)], check=True)
    return t


def main():
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)

        r = Row("1 output over input")
        t, m = copy(SAMPLE, tmp / "t.lct"), copy(MOONCAKE, tmp / "m.jsonl")
        for flags in (["--otlp-file", t], ["--jsonl-out", t]):
            r.run(["replay", t, "-q", *flags], inputs=[t], expect=2, cwd=tmp)
        for flag in ("--report-json", "--report-jsonl", "--report-xlsx", "--otlp-file"):
            r.run(["simulate", m, "-q", flag, m], inputs=[m], expect=2, cwd=tmp)
        r.run(["generate", m, "--from-mooncake", m], inputs=[m], expect=2)
        for flag in ("--json", "--xlsx"):
            r.run(["sweep", "replay", t, "--l1-size-gb", "1,2", "-q", flag, t], inputs=[t], expect=2)
        r0, r1 = tmp / "r0.json", tmp / "r1.json"
        r0.write_text(json.dumps(rank_report(tmp, 0, 2)))
        r1.write_text(json.dumps(rank_report(tmp, 1, 2)))
        r.run(["aggregate", r0, r1, "-q", "--json", r0], inputs=[r0, r1], expect=2)
        rows.append(r)

        r = Row("2 GPU bandwidth")
        r.run(["replay", t, "-q", "--no-csv", "--l2-adapter",
               '{"type":"gpu","capacity_gb":1,"bandwidth_gbps":1e-300}'], inputs=[t], expect=2)
        jl = tmp / "h.jsonl"
        subprocess.run([KVTRACE, "convert", t, jl, "--to", "jsonl"], check=True)
        lines = jl.read_text().splitlines()
        header = json.loads(lines[0])
        cfg = json.loads(header["sm_config_json"])
        # kvtrace's own key for a GPU-budget L1 in a header it wrote.
        cfg["kvtrace_l1_gpu_bandwidth_gbps"] = 0
        header["sm_config_json"] = json.dumps(cfg, sort_keys=True)
        jl.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
        forged = tmp / "forged.lct"
        subprocess.run([KVTRACE, "convert", jl, forged], check=True, capture_output=True)
        r.run(["replay", forged, "-q", "--no-csv"], inputs=[forged], expect=1)
        rows.append(r)

        r = Row("3 SIGTERM info/dump/aggregate")
        big = long_trace(tmp, 3_000_000)
        res = r.run(["info", big, "--threads", "1"], inputs=[big], term_after=0.3, expect=143)
        if res and "interrupted" not in res[1]:
            r.notes.append("info printed no partial mark")
        r.run(["dump", big], inputs=[big], term_after=0.3, expect=143)
        rows.append(r)

        r = Row("5 aggregate memory/forged")
        doc = rank_report(tmp)
        files = []
        for i in range(1000):
            doc["kvtrace"]["rank"]["rank"] = i
            doc["kvtrace"]["rank"]["world_size"] = 1000
            p = tmp / f"agg{i}.json"
            p.write_text(json.dumps(doc))
            files.append(p)
        rss = subprocess.run(["/usr/bin/time", "-f", "%M", KVTRACE, "aggregate", "-q", *files],
                             capture_output=True, text=True)
        r.runs += 1
        r.notes.append(f"1,000 rank reports: exit {rss.returncode}, peak RSS "
                       f"{int(rss.stderr.strip().splitlines()[-1]) / 1024:.0f} MiB")
        doc["kvtrace"]["rank"]["world_size"] = 100_000_000
        forged = tmp / "world.json"
        forged.write_text(json.dumps(doc))
        r.run(["aggregate", "-q", forged], inputs=[forged], limit=20, expect=2)
        doc["kvtrace"]["rank"]["world_size"] = 1
        doc["kvtrace"]["rank"]["rank"] = 0
        doc["kvtrace"]["tiers"] = [{"name": f"tier-{i}", "reads": 1} for i in range(100_000)]
        tiers = tmp / "tiers.json"
        tiers.write_text(json.dumps(doc))
        res = r.run(["aggregate", "-q", tiers], inputs=[tiers], limit=60, expect=0)
        if res:
            r.notes.append(f"10^5 tiers: {res[3]:.1f} s")
        rows.append(r)

        r = Row("6 start barrier")
        res = r.run(["replay", t, "-q", "--rank", "0", "--world-size", "4294967295", "--run-id",
                     "big", "--barrier-timeout", "1", "--output-dir", tmp / "barrier"],
                    limit=30, expect=1)
        if res:
            r.notes.append(f"world 2^32-1: {res[3]:.1f} s for a 1 s timeout")
        r.run(["replay", t, "-q", "--rank", "0", "--world-size", "2", "--run-id", "wait",
               "--barrier-timeout", "60", "--output-dir", tmp / "barrier"],
              term_after=0.5, limit=10, expect=143)
        rows.append(r)

        r = Row("7 sweep cap")
        sizes = ",".join(str(1 + i) for i in range(1000))
        r.run(["sweep", "replay", t, "-q", "--l1-size-gb", sizes, "--eviction-ratio", sizes,
               "--eviction-trigger-watermark", sizes], limit=20, expect=2)
        rows.append(r)

        r = Row("8 concurrent output dir")
        procs = [subprocess.Popen([KVTRACE, "replay", t, "-q", "--json", "--output-dir",
                                   tmp / "shared"], stderr=subprocess.PIPE) for _ in range(8)]
        codes = [p.wait() for p in procs]
        r.runs += 8
        r.notes.append(f"8 at once: {codes.count(0)} wrote, {codes.count(2)} refused (exit 2)")
        rows.append(r)

        r = Row("9 leftovers after a kill")
        left = tmp / ".out.lct.kvtrace-4194304999-0.tmp"
        copy(t, left)
        r.run(["convert", t, tmp / "out.lct"], inputs=[t], expect=0)
        r.notes.append(f"dead run's temporary file removed: {not left.exists()}")
        rows.append(r)

        r = Row("10 huge Mooncake rows")
        row = tmp / "huge.jsonl"
        row.write_text(json.dumps({"timestamp": 0, "input_length": 512, "output_length": 1,
                                   "hash_ids": list(range(1_000_000))}) + "\n")
        r.run(["generate", tmp / "g.lct", "--from-mooncake", row], inputs=[row], expect=1)
        rows.append(r)

        r = Row("11 unbounded CSV line")
        r.run(["bench", "-q", "--use-burst-trace", "--burst-trace-path", "/dev/zero",
               "--duration", "1"], limit=60, expect=1)
        rows.append(r)

        r = Row("12 terminal injection")
        header["sm_config_json"] = "\x1b[31m\nkvtrace: error: forged"
        jl.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
        inj = tmp / "inj.lct"
        subprocess.run([KVTRACE, "convert", jl, inj], capture_output=True)
        res = r.run(["info", inj], inputs=[inj])
        if res and ("\x1b" in res[1] or "\nkvtrace: error" in res[1]):
            r.notes.append("raw escape or forged line printed")
        rows.append(r)

        r = Row("13 aggregate arithmetic")
        a = rank_report(tmp, 0, 2)
        a["kvtrace"]["replayed"] = 2**64 - 1
        b = rank_report(tmp, 1, 2)
        b["kvtrace"]["replayed"] = 5
        pa, pb = tmp / "a.json", tmp / "b.json"
        pa.write_text(json.dumps(a))
        pb.write_text(json.dumps(b))
        r.run(["aggregate", "-q", pa, pb], inputs=[pa, pb], expect=1)
        rows.append(r)

        r = Row("14 cut recording")
        rec = tmp / "rec.lct"
        subprocess.run([KVTRACE, "simulate", MOONCAKE, "-q", "--l1-size-gb", "1", "--record", rec,
                        "--report-json", tmp / "sim.json"], check=True, cwd=tmp)
        data = rec.read_bytes()
        at, frames = 0, []
        while at + 4 <= len(data):
            frames.append(at)
            at += 4 + int.from_bytes(data[at:at + 4], "big")
        cut = tmp / "cut.lct"
        cut.write_bytes(data[:frames[-1]])
        res = r.run(["info", cut], inputs=[cut], expect=0)
        r.notes.append("cut recording says no (no trailer): "
                       f"{bool(res and 'no (no trailer)' in res[1])}")
        rows.append(r)

        r = Row("15 SIGTERM, stuck OTLP endpoint")
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        held = []
        threading.Thread(target=lambda: [held.append(server.accept()) for _ in range(16)],
                         daemon=True).start()
        port = server.getsockname()[1]
        res = r.run(["replay", big, "-q", "--otlp-endpoint", f"http://127.0.0.1:{port}",
                     "--otlp-protocol", "http-protobuf", "--otlp-timeout", "30",
                     "--output-dir", tmp / "otlp"], term_after=1.0, limit=30, expect=143)
        if res:
            r.notes.append(f"exited {res[3] - 1.0:.2f} s after the signal")
        rows.append(r)

        r = Row("16 smaller")
        r.run(["bench", "-q", "--cache-dir", "/", "--duration", "1"], expect=2)
        r.run(["bench", "-q", "--cpu-tier-dir", tmp / "no/such/dir", "--duration", "1"], expect=2)
        r.notes.append(f"--cpu-tier-dir path created: {(tmp / 'no').exists()}")
        rows.append(r)

    print(f"{'row':<34} {'runs':>5} {'panics':>7} {'aborts':>7} {'hangs':>6} {'multi-line':>11} {'lost':>5}")
    for r in rows:
        print(f"{r.name:<34} {r.runs:>5} {r.panics:>7} {r.aborts:>7} {r.hangs:>6} "
              f"{r.multiline:>11} {r.lost:>5}")
        for n in r.notes:
            print(f"    {n}")


if __name__ == "__main__":
    main()
