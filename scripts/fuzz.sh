#!/usr/bin/env bash
# Runs every fuzz target (tests/fuzz/libfuzzer, built by `make fuzz`) for a set time each.
#   scripts/fuzz.sh BUILD_DIR SECONDS [TARGET...]
# Each target starts from its committed seeds (tests/fuzz/corpus/<t>) and regressions
# (tests/fuzz/regressions/<t>), with the dictionary tests/fuzz/dict/<t>.dict where there is one;
# new inputs go to BUILD_DIR/corpus/<t> (kept between runs, not committed). A crash, a leak, a hang (> 10 s per input) or an input using > 2 GiB stops the run:
# the input is saved as BUILD_DIR/crashes/<t>-<kind>-<sha1>, and this script exits 1 and says how
# to reproduce it and to keep it as a regression test (tests/fuzz/regressions/<t>/, replayed by ctest: fuzz_replay_<t>).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/fuzz.sh BUILD_DIR SECONDS [TARGET...]}
seconds=${2:?usage: scripts/fuzz.sh BUILD_DIR SECONDS [TARGET...]}
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(recipe safetensors tokenizer jsonl manifest)

failed=()
for t in "${targets[@]}"; do
  exe="$build/fuzz_$t"
  [ -x "$exe" ] || { echo "fuzz: $exe is missing (make fuzz builds it)" >&2; exit 2; }
  mkdir -p "$build/corpus/$t" "$build/crashes"
  inputs=("$build/corpus/$t" "tests/fuzz/corpus/$t")
  [ -d "tests/fuzz/regressions/$t" ] && inputs+=("tests/fuzz/regressions/$t")
  opts=()
  [ -f "tests/fuzz/dict/$t.dict" ] && opts+=(-dict="tests/fuzz/dict/$t.dict")
  echo "fuzz: $t for ${seconds}s"
  log="$build/fuzz_$t.log"
  if "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -print_final_stats=1 -artifact_prefix="$build/crashes/$t-" "${opts[@]}" "${inputs[@]}" >"$log" 2>&1; then
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)' "$log" | sed "s/^/fuzz: $t: /" || true
  else
    tail -n 40 "$log" >&2
    art=$(grep -oE "$build/crashes/$t-[a-z-]+[0-9a-f]+" "$log" | tail -n 1 || true)
    echo "fuzz: $t FAILED (log: $log)" >&2
    if [ -n "$art" ]; then
      echo "fuzz: reproduce: $exe $art" >&2
      echo "fuzz: once fixed, keep it: mkdir -p tests/fuzz/regressions/$t && cp $art tests/fuzz/regressions/$t/" >&2
    fi
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} target(s) ran ${seconds}s each without a finding"
