#!/usr/bin/env bash
# swarmhub's GPU checks, as one script for a machine with a CUDA device and no package index (the device tool's
# machines: their python3 holds PyTorch with CUDA). Prepare here with `bash bench/gpu/wheels.sh`, then run it
# there from the repository root with .whl carried:  bash bench/gpu/check.sh
#
# 1. A virtual environment over the machine's own Python packages (its torch): the carried wheels installed in
#    it with --no-deps, swarmhub installed editable as `make setup` does; the imports and the device checked.
# 2. bench/worker_overhead.py --device cuda --compare-overlap --quick --precision fp16: a smoke run that fails fast
#    (about 1 minute), in fp16 with PyTorch's GradScaler (what `auto` picks on a GPU without bf16: T4, V100).
# 3. The same in full mode, 2 rounds, precision auto (bf16 on an H100; about 4 minutes): the worker (swarm of one,
#    real server and witness on this machine) against a bare loop on the GPU, and overlap delayed-averaging
#    against none for a GPU peer.
#
# It ends within one device call's limit of 10 minutes: on a 2-core CPU the set-up took 10 s and the quick run
# 80 s, and 2 full rounds take about 240 s (3 took 335 s); its runs time out at 150 and 360 s. Output goes to $OUT (the device tool's folder that comes
# back) or /tmp/gpu-check. DEVICE=cpu and PYTHON=... rehearse it on a machine without a GPU (step 2 then in fp32);
# ROUNDS sets step 3's rounds (0 skips it); QUICK_PRECISION step 2's precision.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpu-check}"
DEVICE="${DEVICE:-cuda}"
ROUNDS="${ROUNDS:-2}"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-/tmp/swarmhub-gpu-venv}"
QUICK_PRECISION="${QUICK_PRECISION:-$([ "$DEVICE" = cpu ] && echo fp32 || echo fp16)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
started=$(date +%s)
step() { echo "== $(( $(date +%s) - started )) s: $*"; }

step "set-up"
if ! ls .whl/*.whl > /dev/null 2>&1; then
    echo "check.sh: no wheels in .whl: run bash bench/gpu/wheels.sh here first, and carry .whl" >&2
    exit 2
fi
# The machine's python3 is itself a virtual environment's, so --system-site-packages would reach the interpreter
# it was made from, not its torch: a .pth file puts its site-packages after the new environment's own instead.
rm -rf "$VENV"
"$PYTHON" -m venv --without-pip "$VENV" || exit 2
site_packages=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' > "$site_packages/_machine.pth" || exit 2
pip=("$PYTHON" -m pip --python "$VENV/bin/python" install --quiet --no-index --no-deps --no-cache-dir)
"${pip[@]}" --no-compile .whl/*.whl || exit 2
"${pip[@]}" --no-build-isolation -e . || exit 2
"$VENV/bin/python" - "$DEVICE" <<'PY' 2>&1 | tee "$OUT/setup.txt" || exit 2
import sys

import hivemind
import torch

import swarmhub
from swarmhub.server.app import create_app  # noqa: F401 - the server imports
from swarmhub.worker.training.peer import resolve_device, resolve_precision

device = resolve_device(sys.argv[1])
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, hivemind {hivemind.__version__}, "
      f"swarmhub {swarmhub.__version__}")
print(f"device {device}: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
      f"precision auto picks {resolve_precision('auto', device)}")
PY
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/setup.txt"
nproc | sed 's/^/cpus: /' | tee -a "$OUT/setup.txt"

step "worker_overhead --quick --compare-overlap on $DEVICE in $QUICK_PRECISION"
timeout 150 "$VENV/bin/python" bench/worker_overhead.py --device "$DEVICE" --precision "$QUICK_PRECISION" \
    --compare-overlap --quick 2>&1 \
    | tee "$OUT/worker_overhead_quick.txt"
quick=${PIPESTATUS[0]}
if [ "$quick" -ne 0 ]; then
    echo "check.sh: the quick run failed (exit $quick): see $OUT/worker_overhead_quick.txt" >&2
    exit 1
fi

if [ "$ROUNDS" -gt 0 ]; then
    step "worker_overhead --compare-overlap --rounds $ROUNDS on $DEVICE"
    timeout 360 "$VENV/bin/python" bench/worker_overhead.py --device "$DEVICE" --compare-overlap --rounds "$ROUNDS" \
        2>&1 | tee "$OUT/worker_overhead.txt"
    full=${PIPESTATUS[0]}
    [ "$full" -eq 0 ] || { echo "check.sh: the full run failed (exit $full)" >&2; exit 1; }
fi
step "done"
