#!/usr/bin/env bash
# make check-torchtitan TORCHTITAN_SRC=DIR TRANSFORMERS_SRC=DIR
#
# torchtitan llama3 against the real consumer, on CPU, in the torch 2.6 chroot (scripts/torch2-chroot.sh):
# a fresh torchtitan llama3 model-only DCP checkpoint written by real torchtitan model code and real dcp.save
# (testdata/gen/torchtitan_fixtures.py gen) -> ucp convert --model-config config.json -> ucp export --to hf, and
# again through Megatron-LM (ucp reshard --to megatron --tp 2 -> ucp convert -> ucp export --to hf): real
# transformers LlamaForCausalLM.from_pretrained must give torchtitan's fp32 logits (max |diff| <= 1e-4, same
# argmax). TORCHTITAN_SRC holds torchtitan/ of pytorch/torchtitan v0.2.0; TRANSFORMERS_SRC holds src/transformers
# (v4.57.1); TRANSFORMERS_SHIMS the shims folder (default ../shared/tools/transformers-shims beside the
# repository). Neither source is changed or committed. Prints PASS/FAIL lines; exit 1 on any FAIL.
set -euo pipefail
tt_src=${1:?TORCHTITAN_SRC}; tf_src=${2:?TRANSFORMERS_SRC}
repo=$(cd "$(dirname "$0")/.." && pwd)
shims=${TRANSFORMERS_SHIMS:-$repo/../shared/tools/transformers-shims}
w=$(mktemp -d /tmp/ucp-check-torchtitan.XXXXXX)
trap 'rm -rf "$w"' EXIT
(cd "$repo" && go build -o "$w/ucp" ./cmd/ucp)
cp -r "$tf_src/src" "$w/tf"
cp -r "$shims" "$w/shims"
mkdir -p "$w/tt"
cp -r "$tt_src/torchtitan" "$w/tt/torchtitan"
cp "$repo/testdata/gen/torchtitan_fixtures.py" "$w/"
run() { "$repo/scripts/torch2-chroot.sh" run "$w" env PYTHONPATH=shims:tt:tf OMP_NUM_THREADS=1 python3 torchtitan_fixtures.py "$@" 2>&1 | grep -E '^(PASS|FAIL)|Error|error' || true; }
"$repo/scripts/torch2-chroot.sh" run "$w" env PYTHONPATH=shims:tt:tf OMP_NUM_THREADS=1 python3 torchtitan_fixtures.py gen case >/dev/null 2>&1
"$w/ucp" convert --quiet "$w/case/checkpoint" "$w/atomic" --model-config "$w/case/config.json"
"$w/ucp" export --quiet "$w/atomic" "$w/hf" --to hf --dtype float32
"$w/ucp" reshard --quiet "$w/atomic" "$w/mg" --to megatron --tp 2
"$w/ucp" convert --quiet "$w/mg" "$w/atomic_mg"
"$w/ucp" export --quiet "$w/atomic_mg" "$w/hf_mg" --to hf --dtype float32
out=$(run check case hf; echo "(through Megatron TP 2:)"; run check case hf_mg)
echo "$out"
! echo "$out" | grep -qv -E '^(PASS|\(through)'
