#!/bin/sh
# GPU check of ucp's loader on a bare GPU machine (x86-64, NVIDIA driver; no Go needed; torch optional), from
# the repository root, with the folder `make gpu-artifacts` built here carried along:
#   scripts/gpu-check.sh [ARTIFACTS]        (default gpu-artifacts; about 3 minutes)
# 1. generates a multi-GB checkpoint there with the carried benchgen (DeepSpeed layout, TP 2 x DP 4) and
#    converts it with the carried ucp into an atomic checkpoint (fp32, exp_avg, exp_avg_sq: about 2.4 GB);
# 2. Go only: the -tags cuda internal/load test binary loads every state into cuMemAlloc'd device memory on
#    one rank (pinned host reads and one copy; again through NCCL if a libnccl.so.2 is found; and cast to
#    bfloat16 on the host), compares each byte with a CPU load and prints GB/s (and of reading the files);
# 3. with torch with CUDA: scripts/gpu_check.py loads into CUDA tensors with transport="ucp" vs "torch", checks
#    them against a CPU load, and with several GPUs loads as a group of one process per GPU.
# Prints lines starting GPUCHECK and ends with "gpu-check: OK" or "gpu-check: FAILED".
set -u
A=${1:-gpu-artifacts}
W=${UCP_GPU_WORK:-${TMPDIR:-/tmp}/ucp-gpu-check}
LAYERS=${UCP_GPU_LAYERS:-2}
HIDDEN=${UCP_GPU_HIDDEN:-2048}
case $A in /*) ;; *) A=$(pwd)/$A ;; esac
fail=0
t0=$(date +%s)
say() { echo "gpu-check [$(($(date +%s) - t0)) s]: $*"; }
for f in ucp benchgen libucp.so load.test; do
	[ -f "$A/$f" ] || { echo "gpu-check: $A/$f is missing: run 'make gpu-artifacts' where Go is, carry $A" >&2; exit 2; }
done
chmod +x "$A/ucp" "$A/benchgen" "$A/load.test" 2>/dev/null || true
say "artifacts from commit $(cat "$A/COMMIT" 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || say "no nvidia-smi"
nproc; free -g | head -2; df -h "${TMPDIR:-/tmp}" | tail -1
rm -rf "$W" && mkdir -p "$W"
trap 'rm -rf "$W"' EXIT

say "generating the checkpoint ($LAYERS layers, hidden $HIDDEN, TP 2 x DP 4)"
"$A/benchgen" -out "$W/src" -layers "$LAYERS" -hidden "$HIDDEN" || { say "benchgen failed"; exit 1; }
"$A/ucp" convert --force "$W/src" "$W/atomic" >"$W/convert.log" 2>&1 || { cat "$W/convert.log"; say "convert failed"; exit 1; }
tail -3 "$W/convert.log"
rm -rf "$W/src"
say "atomic checkpoint: $(du -sh "$W/atomic" | cut -f1)"

say "Go-only check (internal/load -tags cuda, cuMemAlloc'd buffers)"
UCP_GPU_CKPT="$W/atomic" UCP_REQUIRE_GPU=1 timeout 150 "$A/load.test" -test.run '^TestCUDALoad$' -test.v \
	-test.timeout 140s >"$W/go.log" 2>&1
rc=$?
grep -E 'GPUCHECK|^(---|ok|FAIL|PASS)|panic|Error|error' "$W/go.log" | cut -c1-600
[ $rc -eq 0 ] || { fail=1; say "Go-only check FAILED (exit $rc)"; tail -20 "$W/go.log"; }

PY=${PYTHON:-python3}
if $PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	say "torch check (scripts/gpu_check.py)"
	UCP_LIBRARY="$A/libucp.so" timeout 150 $PY scripts/gpu_check.py "$W/atomic" >"$W/py.log" 2>&1
	rc=$?
	cut -c1-800 "$W/py.log"
	[ $rc -eq 0 ] || { fail=1; say "torch check FAILED"; }
else
	say "torch with CUDA is not available to $PY: the Go-only check above is the GPU check"
fi
if [ $fail -eq 0 ]; then say "gpu-check: OK"; else say "gpu-check: FAILED"; fi
exit $fail
