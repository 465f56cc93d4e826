#!/usr/bin/env bash
# Installs what ciuic needs to build and test, and nothing that is already there.
#   scripts/setup-deps.sh            Debian packages + .venv with torch (LibTorch)
#   scripts/setup-deps.sh --tests    also what the Python tests import (`make test`): pinned
#                                    transformers, tensorboard's event reader (the test that reads
#                                    ciuic's event files) and, so that `import torch` works, torch's
#                                    own runtime wheels (nvidia-*, ~2.7 GB) on a machine without a GPU too
#   scripts/setup-deps.sh --fixtures also sentencepiece, sacrebleu, rouge-score and transformers' optional
#                                    dependencies (fixture generators)
#   scripts/setup-deps.sh --fuzz     also clang with libFuzzer and llvm-symbolizer (the fuzzing in
#                                    `make test` and `make fuzz`); fails when they cannot be had
# Idempotent: a second run prints "ok" lines and changes nothing.
# Environment: CIUIC_VENV (default .venv), CIUIC_TORCH_VERSION (default 2.11.0, the GPU host's),
#   CIUIC_TORCH_DEPS=1 to install torch's Python dependencies (the nvidia-* CUDA wheels, ~2.7 GB)
#   on a machine without a GPU too (--tests does this when `import torch` fails). Otherwise a machine
#   without nvidia-smi gets the torch wheel alone: the CPU build links only libtorch_cpu/libc10
#   from it (found without importing torch), and `make demo` imports torch nowhere.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=${CIUIC_TORCH_VERSION:-2.11.0}
VENV=${CIUIC_VENV:-.venv}
want_fixtures=0
want_fuzz=0
want_tests=0
for a in "$@"; do
  case "$a" in
    --tests) want_tests=1 ;;
    --fixtures) want_fixtures=1; want_tests=1 ;;
    --fuzz) want_fuzz=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "setup-deps: unknown argument '$a'" >&2; exit 2 ;;
  esac
done

say() { printf 'setup-deps: %s\n' "$*"; }

# ---- Debian packages -------------------------------------------------------------------------
apt_pkgs=(cmake ninja-build g++ make ccache pkg-config
          libboost-dev libboost-program-options-dev
          libtomlplusplus-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev libpcre2-dev libyaml-dev libicu-dev
          clang-format python3-venv python3-pip)
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

# ---- --tests: what the Python tests import -------------------------------------------------
# transformers imports torch, and the PyPI torch wheel's `import torch` loads its CUDA runtime
# libraries (libtorch_global_deps: cuDNN, cuBLAS, NCCL, cuFile, ...) even on a machine without a
# GPU: without the nvidia-* wheels it fails ("libcufile.so.0: cannot open shared object file").
# So --tests installs torch's declared dependencies when `import torch` fails (from PyPI, ~2.7 GB,
# about a minute on the CI machine); `make demo` does not need them.
if [ "$want_tests" = 1 ]; then
  if "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    say "ok: import torch works in $VENV"
  else
    say "installing torch==$TORCH_VERSION's runtime dependencies into $VENV (import torch needs them; ~2.7 GB)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile "torch==$TORCH_VERSION"
    "$VENV/bin/python" -c "import torch" || { echo "setup-deps: import torch still fails in $VENV" >&2; exit 1; }
  fi
  # hf_export_stops_at_eos (tests/model) fails without it, so CI always installs it. --no-deps with
  # exactly the modules that `import torch`, AutoTokenizer, AutoModelForCausalLM, generate() and
  # apply_chat_template import (found by running that test in a venv holding torch alone): 21
  # wheels, 29 MB, where pip's resolver adds 14 more (typer, rich, pygments, pydantic, hf-xet, ...)
  # that none of it imports, and pins keep a later release of any of them from changing the test.
  # transformers 5.24.0 is the release the fixtures were generated with; it runs on torch 2.11.0.
  # A failed install (no network) is a warning: the build and the other tests go on.
  hf_pins=(transformers==5.24.0 huggingface_hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0
           pyyaml==6.0.4 regex==2026.11.19 packaging==26.4 tqdm==4.70.1
           httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 idna==3.20 truststore==0.10.5
           typing-extensions==4.16.0 filelock==4.3.1 sympy==1.14.0 mpmath==1.3.0
           jinja2==3.1.6 markupsafe==3.0.4 networkx==3.6.1 fsspec==2026.9.0
           bitsandbytes==0.50.2 peft==0.21.2 accelerate==1.16.0 psutil==7.2.2)
  # bitsandbytes: tests/fixtures/gen_nf4.py, NF4 on CPU (needs torch, numpy, packaging); peft
  # (and what it imports beyond transformers: accelerate, psutil): the LoRA fixtures
  # (tests/fixtures/gen_lora.py) and lora_export_loads_in_peft.
  # Compares installed versions without importing anything (importing torch takes seconds).
  pins_missing() {
    "$VENV/bin/python" - "$@" <<'PY'
import importlib.metadata as m, sys
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try: have = m.version(name)
    except m.PackageNotFoundError: have = None
    if have != want: print(pin)
PY
  }
  hf_missing=$(pins_missing "${hf_pins[@]}")
  if [ -z "$hf_missing" ]; then
    say "ok: transformers and its pinned dependencies (${#hf_pins[@]} packages)"
  else
    say "installing transformers and its pinned dependencies: $(echo $hf_missing)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile --no-deps "${hf_pins[@]}" ||
      say "WARNING: could not install transformers: the test hf_export_stops_at_eos will fail" \
          "(ctest -LE transformers leaves it out)"
  fi
  # tensorboard_reads_ciuic_events (tests/train/read_tensorboard.py) reads ciuic's event files back
  # with TensorBoard's EventAccumulator. --no-deps with what that reader imports (found by importing
  # it in a venv with torch and numpy alone): 3 wheels, 11 MB installed, where pip's resolver adds
  # TensorBoard's server (grpcio, werkzeug, markdown, its data server: 58 MB) that the reader never
  # imports. Under CI=true the test fails, rather than skips, without them.
  tb_pins=(tensorboard==2.21.0 protobuf==7.36.2 absl-py==2.5.1)
  tb_missing=$(pins_missing "${tb_pins[@]}")
  if [ -z "$tb_missing" ]; then
    say "ok: tensorboard's event reader (${#tb_pins[@]} packages)"
  else
    say "installing tensorboard's event reader: $(echo $tb_missing)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile --no-deps "${tb_pins[@]}" ||
      say "WARNING: could not install tensorboard: the test tensorboard_reads_ciuic_events will be skipped"
  fi
fi

if [ "$want_fixtures" = 1 ]; then
  # The fixture generators use transformers and tokenizers (and tests/fixtures/gen_tensorboard.py
  # tensorboard's writer); pip's resolver adds what the pins above leave out.
  # sentencepiece + protobuf: tests/fixtures/gen_tokenizer_spm.py trains SentencePiece models and
  # converts them with transformers' converters (which read the model's protobuf).
  # sacrebleu, rouge-score: tests/fixtures/gen_score.py (BLEU and ROUGE-L references; the fixture
  # it writes is committed, so CI's score_test needs neither).
  fx=(transformers==5.24.0 tensorboard sentencepiece protobuf sacrebleu==2.6.0 rouge-score==0.1.2)
  if "$VENV/bin/python" -c "import tensorboard, typer, sentencepiece, google.protobuf, sacrebleu, rouge_score" 2>/dev/null; then
    say "ok: fixture packages (${fx[*]})"
  else
    say "installing fixture packages: ${fx[*]}"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile "${fx[@]}"
  fi
fi
say "done"
