#!/usr/bin/env bash
# Runs every fuzz target (tests/fuzz/libfuzzer, built by `make fuzz`) for a set time each.
#   scripts/fuzz.sh BUILD_DIR SECONDS [TARGET...]
# Each target starts from its committed seeds (tests/fuzz/corpus/<t>) and regressions
# (tests/fuzz/regressions/<t>), with the dictionary tests/fuzz/dict/<t>.dict where there is one;
# new inputs go to BUILD_DIR/corpus/<t> (kept between runs, not committed). A crash, a leak, a
# hang (> 10 s per input) or an input using > 2 GiB stops that target: the input is saved as
# BUILD_DIR/crashes/<t>-<kind>-<sha1>, and this script names it (and prints it in base64 when it
# is at most 16 KiB: CI's machine is gone after the run), says how to reproduce it and to keep it
# as a regression test (tests/fuzz/regressions/<t>/, replayed by ctest: fuzz_replay_<t>), runs the
# other targets, and exits 1 with a list of the findings' inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/fuzz.sh BUILD_DIR SECONDS [TARGET...]}
seconds=${2:?usage: scripts/fuzz.sh BUILD_DIR SECONDS [TARGET...]}
shift 2
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: SECONDS must be a whole number >= 1 (libFuzzer takes 0 as no limit): $seconds" >&2; exit 2; }
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(recipe safetensors tokenizer jsonl manifest template yaml modelfiles)

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
    if [ -n "$art" ] && [ -f "$art" ]; then
      bytes=$(stat -c %s "$art")
      echo "fuzz: $t: the input: $art ($bytes bytes)" >&2
      # CI's machine is gone after the run: small inputs are printed whole.
      [ "$bytes" -le 16384 ] && echo "fuzz: $t: the input in base64 (base64 -d > FILE): $(base64 -w0 "$art")" >&2
      echo "fuzz: reproduce: $exe $art" >&2
      echo "fuzz: once fixed, keep it: mkdir -p tests/fuzz/regressions/$t && cp $art tests/fuzz/regressions/$t/" >&2
      failed+=("$t: $art")
    else
      failed+=("$t: no input saved, see $log")
    fi
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED, ${#failed[@]} of ${#targets[@]} target(s):" >&2
  printf 'fuzz:   %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} target(s) ran ${seconds}s each without a finding"
