#!/usr/bin/env bash
# Installs what ciuic needs to build and test, and nothing that is already there.
#   scripts/setup-deps.sh            Debian packages + .venv with torch (LibTorch)
#   scripts/setup-deps.sh --fixtures also transformers/tokenizers/safetensors/tensorboard (fixture
#                                    generators, and the tests that read ciuic's outputs with them)
#   scripts/setup-deps.sh --fuzz     also clang with libFuzzer and llvm-symbolizer (the fuzzing in
#                                    `make test` and `make fuzz`); fails when they cannot be had
# Idempotent: a second run prints "ok" lines and changes nothing.
# Environment: CIUIC_VENV (default .venv), CIUIC_TORCH_VERSION (default 2.11.0, the GPU host's),
#   CIUIC_TORCH_DEPS=1 to install torch's Python dependencies (the nvidia-* CUDA wheels, ~2.7 GB)
#   on a machine without a GPU too. By default a machine without nvidia-smi gets the torch wheel
#   alone: the CPU build links only libtorch_cpu/libc10 from it (found without importing torch),
#   and nothing of ciuic imports torch in Python.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=${CIUIC_TORCH_VERSION:-2.11.0}
VENV=${CIUIC_VENV:-.venv}
want_fixtures=0
want_fuzz=0
for a in "$@"; do
  case "$a" in
    --fixtures) want_fixtures=1 ;;
    --fuzz) want_fuzz=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "setup-deps: unknown argument '$a'" >&2; exit 2 ;;
  esac
done

say() { printf 'setup-deps: %s\n' "$*"; }

# ---- Debian packages -------------------------------------------------------------------------
apt_pkgs=(cmake ninja-build g++ make ccache pkg-config
          libboost-dev libboost-program-options-dev
          libtomlplusplus-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev libpcre2-dev
          python3-venv python3-pip)
missing=()
for p in "${apt_pkgs[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then :; else missing+=("$p"); fi
done
if [ ${#missing[@]} -eq 0 ]; then
  say "ok: Debian packages (${#apt_pkgs[@]} present)"
else
  say "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ---- clang + libFuzzer (--fuzz) ----------------------------------------------------------------
# Checked by building a fuzz target, not by package name: Debian 12 ships libFuzzer and the
# sanitizer runtimes in libclang-rt-dev (only recommended by clang), older releases in clang's own
# packages. llvm gives llvm-symbolizer, for readable stack traces in a finding's report.
if [ "$want_fuzz" = 1 ]; then
  fuzz_probe() {
    local d rc
    d=$(mktemp -d)
    printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
      'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' > "$d/probe.cpp"
    clang++ -fsanitize=fuzzer,address,undefined "$d/probe.cpp" -o "$d/probe" >"$d/log" 2>&1 && "$d/probe" -runs=1 >>"$d/log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || sed 's/^/setup-deps:   /' "$d/log" | tail -n 5 >&2
    rm -rf "$d"
    return $rc
  }
  if command -v clang++ >/dev/null 2>&1 && command -v llvm-symbolizer >/dev/null 2>&1 && fuzz_probe 2>/dev/null; then
    say "ok: clang++ with libFuzzer ($(clang++ --version | head -n 1))"
  else
    fuzz_pkgs=(clang llvm)
    apt-cache show libclang-rt-dev >/dev/null 2>&1 && fuzz_pkgs+=(libclang-rt-dev)
    say "installing clang with libFuzzer: ${fuzz_pkgs[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${fuzz_pkgs[@]}"; } ||
      say "apt-get could not install ${fuzz_pkgs[*]}"
    if ! command -v clang++ >/dev/null 2>&1 || ! fuzz_probe; then
      say "ERROR: no clang++ that builds a libFuzzer target (-fsanitize=fuzzer,address,undefined)." >&2
      say "ERROR: \`make test\` fuzzes the parsers with it (docs/reliability.md, \"Fuzzing\"); install clang" >&2
      say "ERROR: and its runtime libraries, or skip the fuzzing with \`make test FUZZ_SECONDS=0\` (not in CI)." >&2
      exit 1
    fi
    say "ok: clang++ with libFuzzer ($(clang++ --version | head -n 1))"
  fi
fi

# ---- Python venv with torch (LibTorch for C++) ------------------------------------------------
# pip --no-compile: no .pyc for torch's thousands of modules (minutes on a slow 2-core machine;
# the C++ build never imports them).
if [ ! -x "$VENV/bin/python" ]; then
  say "creating Python venv $VENV"
  python3 -m venv "$VENV"
fi
have_torch=$("$VENV/bin/python" - <<'PY' 2>/dev/null || true
import importlib.metadata as m
try: print(m.version("torch"))
except Exception: pass
PY
)
if [ "${have_torch%%+*}" = "$TORCH_VERSION" ]; then
  say "ok: torch $have_torch in $VENV"
else
  if command -v nvidia-smi >/dev/null 2>&1 || [ "${CIUIC_TORCH_DEPS:-0}" = 1 ]; then
    say "installing torch==$TORCH_VERSION with its CUDA dependencies into $VENV (LibTorch; large download, once)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile "torch==$TORCH_VERSION" numpy
  else
    # No GPU here: the wheel alone (LibTorch's CPU libraries and headers), not the 2.7 GB of
    # nvidia-* wheels a CPU build never loads. CIUIC_TORCH_DEPS=1 installs them anyway.
    say "installing torch==$TORCH_VERSION (the wheel alone: no GPU here) into $VENV (LibTorch; large download, once)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile --no-deps "torch==$TORCH_VERSION"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile numpy
  fi
fi

if [ "$want_fixtures" = 1 ]; then
  # transformers and tokenizers generate fixtures; torch's own Python dependencies (not the CUDA
  # wheels) let `import torch` work where the wheel was installed alone.
  # tensorboard: its event reader checks ciuic's event files (tests/train/read_tensorboard.py);
  # measured: ~19 MB of wheels, 58 MB installed (tensorboard 12, its data server 20, grpcio 19,
  # protobuf, markdown, werkzeug, absl) -- too much for every CI run, where monitoring_test checks
  # the bytes against a committed file written by tensorboard instead.
  fx=(transformers tokenizers safetensors tensorboard filelock typing-extensions sympy networkx jinja2 fsspec)
  if "$VENV/bin/python" -c "import transformers, tokenizers, safetensors, tensorboard" 2>/dev/null; then
    say "ok: fixture packages (${fx[*]})"
  else
    say "installing fixture packages: ${fx[*]}"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile "${fx[@]}"
  fi
fi
say "done"
