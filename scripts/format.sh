#!/usr/bin/env bash
# clang-format with the tree's .clang-format (docs/plugins.md, "Code style").
#   scripts/format.sh FILE...          format these files in place (make format FILES="...")
#   scripts/format.sh --check [FILE...] list the files clang-format would change, change nothing;
#                                      exit 1 if any would change (make format-check [FILES=...]);
#                                      without FILE, every tracked C++ file (the ctest format_check, in CI).
#   scripts/format.sh --all            format every tracked C++ file in place: the one whole-tree
#                                      pass, to be made as ONE commit of its own at a quiet moment
#                                      (no other branch open), never mixed with other changes.
# The C++ files: what git tracks as *.h *.hpp *.cpp *.cc *.cu *.cuh (not the CMake templates
# *.h.in). The formatter: $CLANG_FORMAT, else clang-format (Debian: apt-get install clang-format).
# Its output differs between clang-format releases; the tree's reference is the major release in
# kMajor below (Debian 12's clang-format 14): another one formats, but says so.
set -euo pipefail
# FILE arguments are relative to where the script is called from; it then works at the top.
args=()
for a in "$@"; do
  case "$a" in -*) args+=("$a") ;; *) args+=("$(realpath -m -- "$a")") ;; esac
done
set -- ${args[@]+"${args[@]}"}
cd "$(dirname "$0")/.."

kMajor=14
CF=${CLANG_FORMAT:-clang-format}
if ! command -v "$CF" >/dev/null 2>&1; then
  echo "format.sh: no $CF on PATH (apt-get install clang-format, or set CLANG_FORMAT=...)" >&2
  exit 2
fi
major=$("$CF" --version | sed -n 's/.*clang-format version \([0-9]*\).*/\1/p')
if [ "$major" != "$kMajor" ]; then
  echo "format.sh: warning: $("$CF" --version) is not clang-format $kMajor, the release the tree is formatted with; its output may differ" >&2
fi

tracked() { git ls-files -- '*.h' '*.hpp' '*.cpp' '*.cc' '*.cu' '*.cuh'; }

mode=apply
case "${1:-}" in
  --check) mode=check; shift ;;
  --all) mode=all; shift ;;
  -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
esac

files=("$@")
if [ "$mode" = all ]; then
  [ ${#files[@]} -eq 0 ] || { echo "format.sh: --all takes no files" >&2; exit 2; }
  mapfile -t files < <(tracked)
  mode=apply
elif [ "$mode" = check ] && [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(tracked)
elif [ ${#files[@]} -eq 0 ]; then
  echo "format.sh: name the files to format (scripts/format.sh FILE...); the whole tree is --all, one commit of its own" >&2
  exit 2
fi
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "format.sh: $f: no such file" >&2; exit 2; }
done

if [ "$mode" = apply ]; then
  "$CF" -i --style="file:$PWD/.clang-format" "${files[@]}"
  exit 0
fi

differ=0
for f in "${files[@]}"; do
  if ! "$CF" --style="file:$PWD/.clang-format" --assume-filename="$f" < "$f" | cmp -s - "$f"; then
    realpath --relative-to=. -- "$f"
    differ=$((differ + 1))
  fi
done
if [ "$differ" -gt 0 ]; then
  echo "format.sh: $differ of ${#files[@]} files differ from clang-format's output (scripts/format.sh FILE... formats them)" >&2
  exit 1
fi
echo "format.sh: ${#files[@]} files as clang-format writes them" >&2
