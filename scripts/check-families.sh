#!/usr/bin/env bash
# make check-families MEGATRON_SRC=DIR TRANSFORMERS_SRC=DIR
#
# The model-family mappings against the real consumers, on CPU, in the torch 2.6 chroot
# (scripts/torch2-chroot.sh): for llama (3.1 rope scaling), mistral, qwen2 and qwen3,
#   import: a random fp32 model saved by real transformers -> ucp convert --from hf -> ucp reshard --to megatron
#           --tp 2 --megatron-spec local -> real megatron-core GPTModel at TP 2 loads it (strict) and must give
#           transformers' logits; again with --ckpt-format torch_dist (dist_checkpointing.load);
#   export: that Megatron checkpoint -> ucp convert -> ucp export --to hf -> transformers from_pretrained must
#           give megatron-core's logits; again with the checkpoint's args set to rotary_interleaved (llama31,
#           qwen3): megatron-core computes interleaved RoPE, the export must reorder q/k rows to match.
# MEGATRON_SRC holds megatron/ (a megatron-core release, e.g. core_v0.14.0); TRANSFORMERS_SRC holds
# src/transformers (v4.57.1); TRANSFORMERS_SHIMS the shims folder (default ../shared/tools/transformers-shims
# beside the repository). Neither source is changed or committed. Prints PASS/FAIL lines; exit 1 on any FAIL.
set -euo pipefail
mg_src=${1:?MEGATRON_SRC}; tf_src=${2:?TRANSFORMERS_SRC}
repo=$(cd "$(dirname "$0")/.." && pwd)
shims=${TRANSFORMERS_SHIMS:-$repo/../shared/tools/transformers-shims}   # the two import shims of ../shared/recipes/transformers-offline.md
w=$(mktemp -d /tmp/ucp-check-families.XXXXXX)
trap 'rm -rf "$w"' EXIT
(cd "$repo" && go build -o "$w/ucp" ./cmd/ucp)
mkdir -p "$w/check" "$w/gen" "$w/mlm"
cp -r "$tf_src/src" "$w/tf"
cp -r "$shims" "$w/shims"
cp -r "$mg_src/megatron" "$w/mlm/megatron"
cp "$repo/testdata/check/check_families.py" "$w/check/"
cp "$repo/testdata/gen/megatron_dist_fixtures.py" "$repo/testdata/gen/hf_family_fixtures.py" "$w/gen/"
run() { "$repo/scripts/torch2-chroot.sh" run "$w" env PYTHONPATH=shims:tf:mlm OMP_NUM_THREADS=1 python3 check/check_families.py "$@"; }
fail=0
run hf . || fail=1
for c in llama31 mistral qwen2 qwen3; do
  "$w/ucp" convert --quiet --from hf "$w/$c/hf" "$w/$c/atomic" >/dev/null
  "$w/ucp" reshard --quiet "$w/$c/atomic" "$w/$c/mg" --to megatron --tp 2 --megatron-spec local >/dev/null
  run megatron . "$c" "$c/mg" plain || fail=1
  # The same weights as --ckpt-format torch_dist (megatron-core's dist_checkpointing.load).
  "$w/ucp" reshard --quiet "$w/$c/atomic" "$w/$c/mgd" --to megatron --ckpt-format torch_dist --tp 2 --megatron-spec local >/dev/null
  run megatron . "$c" "$c/mgd" dist || fail=1
  arch=auto; [ "$c" = mistral ] && arch=mistral   # Megatron's args cannot tell mistral from llama
  variants=plain; case $c in llama31|qwen3) variants="plain inter";; esac
  for v in $variants; do
    src=$c/mg
    if [ "$v" = inter ]; then
      cp -r "$w/$c/mg" "$w/$c/mg_inter"; src=$c/mg_inter
      run setargs "$src" rotary_interleaved=true
      run megatron . "$c" "$src" inter || fail=1
    fi
    "$w/ucp" convert --quiet "$w/$src" "$w/$c/atomic_$v" >/dev/null
    "$w/ucp" export --quiet "$w/$c/atomic_$v" "$w/$c/export_$v" --to hf --dtype float32 --arch "$arch" >/dev/null
    run export . "$c" "$c/export_$v" "$v" || fail=1
  done
done
exit $fail
