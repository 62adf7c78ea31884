#!/usr/bin/env bash
# Has real megatron-core write the torch_dist fixtures' model at ~120 MB (2 layers, hidden 512, 8
# heads in 4 query groups of 64, SwiGLU ffn 1024, vocabulary 4000 padded to 4096: 8.8 M parameters,
# bf16 weights plus fp32 main parameters and Adam moments), TP 2 x DP 2, fully_reshardable, on CPU in
# the torch 2.6 chroot (testdata/gen/megatron_dist_fixtures.py with UCP_MEGATRON_GEOMETRY). Used by
# scripts/megatron-check.sh (MEGATRON_CHECK_TIME=big) and scripts/bench.sh (BENCH_MEGATRON_SRC).
#
#   scripts/megatron-big.sh MEGATRON_SRC OUT     writes OUT/core<M>_<m>_tp2_dp2_bf16_fullrs/{checkpoint,truth.pt}
#
# Prints the UCP_MEGATRON_GEOMETRY value it used (the loads must build the same model) and keeps it in
# OUT/geometry.
set -euo pipefail
src=${1:?usage: $0 MEGATRON_SRC OUT}; out=${2:?usage: $0 MEGATRON_SRC OUT}
[ -d "$src/megatron/core" ] || { echo "megatron-big: $src has no megatron/core" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
geometry=2,512,8,4,64,1024,4000,4096
work=$(mktemp -d /var/tmp/ucp-megatron-big.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/out" "$out"
cp -r "$src/megatron" "$work/src/"
cp "$here/testdata/gen/megatron_dist_fixtures.py" "$work/"
"$here/scripts/torch2-chroot.sh" run "$work" env UCP_MEGATRON_GEOMETRY=$geometry UCP_CASE_TIMEOUT=1500 \
  python3 megatron_dist_fixtures.py src out tp2_dp2_bf16_fullrs >"$work/log" 2>&1 || { tail -30 "$work/log" >&2; exit 1; }
for d in "$work"/out/*/; do
  rm -rf "${out:?}/$(basename "$d")"
  mv "$d" "$out/"
done
echo "$geometry" > "$out/geometry"
echo "$geometry"
