#!/usr/bin/env bash
# Regenerates the GroupedMLP (legacy grouped GEMM) fixtures with real megatron-core on CPU, inside the
# torch 2.6 chroot of scripts/torch2-chroot.sh, with the CPU stand-in for the CUDA package grouped_gemm
# (testdata/gen/cpu_shims/grouped_gemm):
#
#   scripts/megatron-grouped-fixtures.sh MEGATRON_SRC [CASE ...]
#
# MEGATRON_SRC is a Megatron-LM release tree that still has GroupedMLP (core_v0.15.3, core_v0.14.0;
# removed in core_v0.17.0). Cases are named core<major>_<minor>_<case>; `*_torch` cases go to
# testdata/fixtures/megatron (--ckpt-format torch), `*_dist` cases to testdata/fixtures/megatron_dist.
# Rerunning replaces those of the same version. Not run by CI.
set -euo pipefail
src=${1:?usage: $0 MEGATRON_SRC [CASE ...]}; shift
[ -f "$src/megatron/core/transformer/moe/grouped_gemm_util.py" ] || { echo "megatron-grouped-fixtures: $src has no GroupedMLP (megatron/core/transformer/moe/grouped_gemm_util.py)" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /var/tmp/ucp-megatron-grouped.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/out"
cp -r "$src/megatron" "$work/src/"
cp -r "$here/testdata/gen/cpu_shims" "$work/"
cp "$here/testdata/gen/megatron_dist_fixtures.py" "$here/testdata/gen/megatron_grouped_fixtures.py" \
  "$here/testdata/gen/megatron_grouped_verify.py" "$work/"
"$here/scripts/torch2-chroot.sh" run "$work" env OMP_NUM_THREADS=1 python3 megatron_grouped_fixtures.py src out "$@"
# Megatron itself loads each torch_dist case back at TP 1 / EP 1 (GroupedMLP's own merge of the per-expert
# tensors) and must give the truth's weights.
for d in "$work"/out/*_dist/; do
  [ -d "$d" ] || continue
  name=$(basename "$d")
  "$here/scripts/torch2-chroot.sh" run "$work" env OMP_NUM_THREADS=1 python3 megatron_grouped_verify.py src "out/$name" "$(echo "$name" | sed 's/^core[0-9]*_[0-9]*_//')"
done
for d in "$work"/out/*/; do
  name=$(basename "$d")
  case $name in
    *_torch) dst=$here/testdata/fixtures/megatron ;;
    *_dist) dst=$here/testdata/fixtures/megatron_dist ;;
    *) echo "megatron-grouped-fixtures: unexpected case $name" >&2; exit 1 ;;
  esac
  rm -rf "${dst:?}/$name"
  cp -r "$d" "$dst/$name"
  echo "megatron-grouped-fixtures: $dst/$name ($(du -sh "$dst/$name" | cut -f1))"
done
