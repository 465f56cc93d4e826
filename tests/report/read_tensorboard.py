#!/usr/bin/env python3
"""Reads the TensorBoard event files that monitoring_test wrote with ciuic's TensorBoardWriter back
through the `tensorboard` package's event reader (EventAccumulator, what TensorBoard's scalar
dashboard uses) and compares every scalar with the expected.json written next to them. ctest runs
it as tensorboard_reads_ciuic_events after monitoring_test. scripts/setup-deps.sh --tests (`make test`)
installs the reader (tensorboard, protobuf, absl-py); without it the test exits 77, reported as
skipped, except under CI=true, where it fails: CI reads back what it writes.

    .venv/bin/python tests/report/read_tensorboard.py <folder with events.out.tfevents.* and expected.json>
"""
import json
import math
import os
import struct
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    print(f"{'failed' if ci else 'skipped'}: {e} (scripts/setup-deps.sh --tests installs tensorboard's reader)")
    sys.exit(1 if ci else 77)


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main():
    folder = sys.argv[1]
    expected = json.load(open(os.path.join(folder, "expected.json")))
    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    acc.Reload()
    tags = sorted(acc.Tags()["scalars"])
    want_tags = sorted(expected)
    if tags != want_tags:
        print(f"tags differ: read {tags}, expected {want_tags}")
        sys.exit(1)
    bad = 0
    for tag, points in expected.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        want = [(p[0], f32(float(p[1]))) for p in points]
        same = len(got) == len(want) and all(
            gs == ws and (gv == wv or (math.isnan(gv) and math.isnan(wv))) for (gs, gv), (ws, wv) in zip(got, want))
        if not same:
            bad += 1
            print(f"{tag}: read {got}, expected {want}")
    print(f"{len(expected)} tags, {sum(len(v) for v in expected.values())} scalars read back; {bad} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
