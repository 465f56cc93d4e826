#!/usr/bin/env python3
"""Runs a training command and times its life from the outside: seconds from launch to the first
and last progress line ("step N/M | ..."), to exit, and the host memory the machine used beyond
what it used at launch (MemTotal - MemAvailable from /proc/meminfo, sampled every 0.2 s: it counts
page-locked memory, which a process's RSS may not). Prints the command's output with the elapsed
time in front of each line and, at the end, one JSON line (also written to --json).

  scripts/gpu/timeline.py --json out.json -- build-gpu/bin/ciuic-run recipe.toml --set ...

Used by scripts/gpu/hostmem.sh (issue 14: start-up, shutdown and host memory of cpu_adam)."""
import argparse
import json
import re
import subprocess
import sys
import threading
import time

STEP = re.compile(r"\bstep (\d+)/(\d+) \|")


def used_bytes():
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            info[k] = int(v.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the summary here too")
    ap.add_argument("--name", default="", help="a label for the summary")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command")
    base = used_bytes()
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], used_bytes())
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    first = last = None
    steps = 0
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    for line in p.stdout:
        t = time.monotonic() - t0
        m = STEP.search(line)
        if m:
            steps = int(m.group(1))
            first = t if first is None else first
            last = t
        sys.stdout.write(f"[{t:8.2f}] {line}")
        sys.stdout.flush()
    rc = p.wait()
    end = time.monotonic() - t0
    done.set()
    sampler.join()
    out = {
        "name": a.name,
        "rc": rc,
        "first_step_s": first,
        "last_step_s": last,
        "exit_s": round(end, 2),
        "after_last_step_s": None if last is None else round(end - last, 2),
        "last_step": steps,
        "host_used_peak_gib": round((peak[0] - base) / 2**30, 2),
    }
    line = json.dumps(out)
    print(line)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
