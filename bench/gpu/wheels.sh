#!/usr/bin/env bash
# Fetches the wheels bench/gpu/check.sh installs on a GPU machine that cannot reach a package index: the pins in
# bench/gpu/requirements.txt, for CPython 3.12 on x86-64 Linux, into .whl/ at the repository root (ignored by git,
# about 40 MB). Run here, where pip reaches PyPI:  bash bench/gpu/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
rm -rf .whl && mkdir .whl
platforms=()
for p in manylinux_2_39_x86_64 manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
    manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_12_x86_64 manylinux2010_x86_64 \
    manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
# Three pins are published as source only (pure Python): pip builds their wheels here.
source_only="prefetch-generator python-baseconv varint"
binary=$(mktemp) && trap 'rm -f "$binary"' EXIT
grep '==' bench/gpu/requirements.txt | grep -v -E "^(${source_only// /|})==" > "$binary"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl -r "$binary"
"$PYTHON" -m pip wheel --quiet --no-deps -w .whl $(grep -E "^(${source_only// /|})==" bench/gpu/requirements.txt)
wanted=$(grep -c '==' bench/gpu/requirements.txt)
got=$(ls .whl/*.whl | wc -l)
if [ "$got" -ne "$wanted" ]; then
    echo "wheels.sh: $got wheels in .whl for $wanted pins: see pip's output above" >&2
    exit 1
fi
echo "wheels.sh: $got wheels, $(du -sh .whl | cut -f1), in .whl/ (the GPU check carries it: bench/gpu/check.sh)"
