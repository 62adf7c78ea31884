#!/usr/bin/env bash
# Load time of ucp's torch_dist output against Megatron's own checkpoint of the same model, in real
# megatron-core (issue 24: within 1.2x). Megatron's own save of the torch_dist fixtures' model at TP 2 x
# DP 2 (fully_reshardable, written by MEGATRON_SRC's core) is converted and rewritten by ucp at the same
# degrees and in that core's layout; one Megatron run (4 ranks, gloo, the torch 2.6 chroot) builds the
# model once and loads both checkpoints ROUNDS times, alternating (testdata/gen/megatron_dist_load.py
# UCP_TIME_ROUNDS: the steps of load_checkpoint's torch_dist path, every value NaN before each load,
# both loads of the last round compared with the truth bit for bit). Prints each load's wall time
# (slowest rank) and CPU time (all ranks' processes), then the ratio line of the medians.
#
#   scripts/megatron-loadtime.sh MEGATRON_SRC [BIG_DIR] [UCP_BIN]
#
# BIG_DIR: a ~125 MB model (scripts/megatron-big.sh output, same core), written there first when
# BIG_DIR has none (about 2 minutes); without it the stored kilobyte fixture (testdata/fixtures/
# megatron_dist). MEGATRON_LOADTIME_ROUNDS (default 5) loads of each.
set -euo pipefail
src=${1:?usage: $0 MEGATRON_SRC [BIG_DIR] [UCP_BIN]}
big=${2:-}
[ -d "$src/megatron/core" ] || { echo "megatron-loadtime: $src has no megatron/core" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
ucp=${3:-$here/bin/ucp}
[ -x "$ucp" ] || (cd "$here" && go build -o "$ucp" ./cmd/ucp)
core=$(sed -n 's/^MAJOR = \([0-9]*\)/\1/p; s/^MINOR = \([0-9]*\)/\1/p' "$src/megatron/core/package_info.py" | paste -sd.)
own=core${core/./_}_tp2_dp2_bf16_fullrs
fx=$here/testdata/fixtures/megatron_dist
geometry=
if [ -n "$big" ]; then
  [ -f "$big/geometry" ] && [ -d "$big/$own" ] || "$here/scripts/megatron-big.sh" "$src" "$big" >/dev/null
  fx=$big
  geometry=$(cat "$big/geometry")
fi
[ -d "$fx/$own" ] || { echo "megatron-loadtime: no $own in $fx (Megatron's own save with core $core)" >&2; exit 2; }
work=$(mktemp -d /var/tmp/ucp-megatron-loadtime.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/time/own" "$work/cpu_shims"
cp -r "$src/megatron" "$work/src/"
cp "$here/testdata/gen/megatron_dist_fixtures.py" "$here/testdata/gen/megatron_dist_load.py" "$work/"
cp "$here/testdata/gen/cpu_shims/"{fused_adam,six}.py "$work/cpu_shims/"
"$ucp" convert "$fx/$own/checkpoint" "$work/atomic" --quiet
"$ucp" reshard "$work/atomic" "$work/time/ucp/written" --to megatron --ckpt-format torch_dist --megatron-core "$core" --tp 2 --dp 2 --quiet
cp -r "$fx/$own/checkpoint" "$work/time/own/written"
cp "$fx/$own/truth.pt" "$work/time/"
echo "core $core, $(du -sb "$work/time/own/written" | cut -f1) bytes (Megatron's save, $(find "$work/time/own/written" -name '*.distcp' | wc -l) .distcp), $(du -sb "$work/time/ucp/written" | cut -f1) bytes (ucp's, $(find "$work/time/ucp/written" -name '*.distcp' | wc -l) .distcp)"
timeout -k 10 1200 "$here/scripts/torch2-chroot.sh" run "$work" env UCP_TIME_ROUNDS="${MEGATRON_LOADTIME_ROUNDS:-5}" \
  UCP_MEGATRON_GEOMETRY="$geometry" python3 megatron_dist_load.py src time tp2_dp2_bf16_fullrs 2 1 2 >"$work/log" 2>&1 \
  || { tail -30 "$work/log" >&2; exit 1; }
grep -E '^(round|load time|ok)' "$work/log"
