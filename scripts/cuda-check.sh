#!/usr/bin/env bash
# Compiles the CUDA side of the tree on a machine WITHOUT a GPU or a CUDA toolkit, to catch what
# only a CUDA build would see before a GPU host is lent (docs/reliability.md, "CUDA code without a
# GPU"): every .cu file through nvcc 13.0 for sm_90 (the GPU host's toolkit and architecture), and
# every .cpp that has a CIUIC_FUSED_KERNELS branch compiled with it defined (the flags of the CPU
# build's compile_commands.json, plus the CUDA headers), then checks that each kernel wrapper the
# host code calls is defined by a .cu object. Nothing runs on a device: this is a compile check.
# The toolkit comes from PyPI's wheels (nvcc, nvvm, cccl; the CUDA runtime headers are torch's
# dependency in .venv), unpacked once into .deps/cuda13 (git-ignored).
#   scripts/cuda-check.sh [BUILD]      (BUILD: a configured CPU build folder, default build)
# Exit 0 when everything compiles and links up; 1 otherwise, with the compiler's messages.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
py=.venv/bin/python
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
tk=.deps/cuda13
if [ ! -x "$tk/nvvm/bin/cicc" ]; then
  echo "cuda-check: fetching nvcc 13.0 (PyPI wheels) into $tk"
  rm -rf "$tk" .deps/cuda13-whl && mkdir -p "$tk" .deps/cuda13-whl
  "$py" -m pip download -q --no-deps -d .deps/cuda13-whl "nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-cccl==13.0.*"
  for w in .deps/cuda13-whl/*.whl; do (cd .deps/cuda13-whl && unzip -qo "$(basename "$w")" 'nvidia/*'); done
  cp -r .deps/cuda13-whl/nvidia/cu13/. "$tk/"
  cp -rn "$site/nvidia/cu13/include/." "$tk/include/"
  chmod +x "$tk"/bin/* "$tk"/nvvm/bin/*
  rm -rf .deps/cuda13-whl
fi
[ -f "$build/compile_commands.json" ] || { echo "cuda-check: $build/compile_commands.json missing (configure first: make configure)"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ok=1
for f in $(git ls-files '*.cu'); do
  if "$tk/bin/nvcc" -std=c++17 -O3 -arch=sm_90 -c "$f" -o "$out/$(basename "$f").o" \
      -Icore/src -Icore/include -Icore/sdk -Iplugins/optim/kit/include -Iplugins/optim/kit/src 2> "$out/err"; then
    echo "nvcc ok: $f"
  else
    ok=0; echo "nvcc FAILED: $f"; cat "$out/err"
  fi
done
"$py" - "$build" "$out" "$PWD/$tk/include" <<'PY' || ok=0
import json, os, subprocess, sys
build, out, cuda_inc = sys.argv[1:]
ok = True
for e in json.load(open(os.path.join(build, "compile_commands.json"))):
    src = e["file"]
    if not src.endswith(".cpp") or "CIUIC_FUSED_KERNELS" not in open(src, errors="replace").read():
        continue
    cmd = e["command"].split()
    i = cmd.index("-o")
    cmd[i + 1] = os.path.join(out, os.path.basename(src) + ".o")
    while cmd and not cmd[0].endswith(("c++", "g++", "clang++")):
        cmd.pop(0)  # the ccache launcher
    cmd += ["-DCIUIC_FUSED_KERNELS=1", "-I" + cuda_inc]
    r = subprocess.run(cmd, cwd=e["directory"], capture_output=True, text=True)
    print(("g++ ok: " if r.returncode == 0 else "g++ FAILED: ") + os.path.relpath(src))
    if r.returncode:
        ok = False
        print(r.stderr[-4000:])
sys.exit(0 if ok else 1)
PY
# Every ciuic symbol the host objects need from the kernels is defined by some .cu object.
nm -C --undefined-only "$out"/*.cpp.o 2>/dev/null | sed -n 's/^ *U //p' | grep '^ciuic::' | sort -u > "$out/need"
nm -C --defined-only "$out"/*.cu.o | sed -n 's/^[0-9a-f]* [TWt] //p' | sort -u > "$out/have"
nm -C --defined-only "$out"/*.cpp.o | sed -n 's/^[0-9a-f]* [TWtVvuBDdRr] //p' | sort -u >> "$out/have"
sort -u -o "$out/have" "$out/have"
missing=$(comm -23 "$out/need" "$out/have" | grep -i 'cuda\|kernel\|nf4\|fused' || true)
if [ -n "$missing" ]; then ok=0; echo "undefined kernel wrappers:"; echo "$missing"; fi
[ $ok = 1 ] && echo "cuda-check: PASS" || { echo "cuda-check: FAIL"; exit 1; }
