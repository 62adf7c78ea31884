#!/usr/bin/env bash
# make check-moe MEGATRON_SRC=DIR TRANSFORMERS_SRC=DIR: the MoE families (mixtral, qwen3_moe, qwen2_moe, deepseek_v3) against
# real megatron-core (a Megatron-LM release tree holding megatron/, e.g. core_v0.19.0) and real transformers (a tree
# holding src/transformers, e.g. v4.57.1), on CPU in the torch 2.6 chroot (scripts/torch2-chroot.sh; transformers
# offline with the shims of ../shared/tools/transformers-shims, or TRANSFORMERS_SHIMS). testdata/check/check_moe.py
# says what each phase checks. Not run by CI.
set -euo pipefail
mg=${1:?usage: $0 MEGATRON_SRC TRANSFORMERS_SRC [UCP] [CASE ...]}
tf=${2:?usage: $0 MEGATRON_SRC TRANSFORMERS_SRC [UCP] [CASE ...]}
ucp=$(readlink -f "${3:-bin/ucp}")
shift 3 || shift $#
cases=${*:-mixtral qwen3_moe qwen2_moe deepseek_v3}
here=$(cd "$(dirname "$0")/.." && pwd)
shims=${TRANSFORMERS_SHIMS:-$here/../shared/tools/transformers-shims}
[ -d "$mg/megatron/core" ] || { echo "check-moe: $mg has no megatron/core" >&2; exit 2; }
[ -d "$tf/src/transformers" ] || { echo "check-moe: $tf has no src/transformers" >&2; exit 2; }
[ -d "$shims/huggingface_hub" ] || { echo "check-moe: no transformers shims at $shims (set TRANSFORMERS_SHIMS)" >&2; exit 2; }
work=$(mktemp -d /var/tmp/ucp-check-moe.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/hf" "$work/gen" "$work/out"
cp -r "$mg/megatron" "$work/src/"
cp -r "$tf/src/transformers" "$work/hf/"
cp -r "$shims" "$work/shims"
cp "$here/testdata/check/check_moe.py" "$here/testdata/gen/megatron_dist_fixtures.py" "$work/"
cp "$here/testdata/gen/hf_family_fixtures.py" "$work/gen/"
py() { timeout 900 "$here/scripts/torch2-chroot.sh" run "$work" env PYTHONPATH=shims:hf OMP_NUM_THREADS=1 python3 check_moe.py "$@"; }
fail=0
for c in $cases; do
  o=$work/out/$c
  py megatron "$c" || { fail=1; continue; }
  "$ucp" convert --quiet "$o/mcore" "$o/atomic" >/dev/null
  "$ucp" inspect "$o/atomic" | sed -n 2p
  "$ucp" export "$o/atomic" "$o/hf" --to hf >/dev/null
  py export "$c" || fail=1
  py hfsave "$c" || { fail=1; continue; }
  "$ucp" convert --quiet --from hf "$o/hf_src" "$o/atomic_hf" >/dev/null
  "$ucp" export "$o/atomic_hf" "$o/hf_back" --to hf >/dev/null
  py hfback "$c" || fail=1
  # Import into Megatron at new degrees (TP EP expert-TP DP): real megatron-core loads each rank's file.
  degs="1 2 1 2,2 2 1 1"
  [ "$c" = mixtral ] && degs="$degs,2 2 2 2"
  # MLA at TP 2: column-parallel down projections (local spec), read back from Megatron's own save at TP 2.
  [ "$c" = deepseek_v3 ] && degs="1 2 1 2,2 2 1 1,2 2 2 2"
  IFS=, read -ra dl <<<"$degs"
  for d in "${dl[@]}"; do
    read -r tp ep etp dp <<<"$d"
    tag=mg_tp${tp}_ep${ep}_etp${etp}
    "$ucp" reshard --quiet "$o/atomic_hf" "$o/$tag" --to megatron --tp "$tp" --ep "$ep" --expert-tp "$etp" --dp "$dp" --megatron-spec local
    if [ "$etp" = "$tp" ]; then
      py import "$c" "$tag" "$tp" "$ep" "$etp" "$dp" || fail=1
      continue
    fi
    # Expert TP != TP: Megatron's save_checkpoint also writes the loaded model (a real Megatron checkpoint at
    # these degrees); ucp reads it back to transformers' tensors bit for bit.
    py import "$c" "$tag" "$tp" "$ep" "$etp" "$dp" "${tag}_saved" || { fail=1; continue; }
    "$ucp" convert --quiet "$o/${tag}_saved" "$o/atomic_${tag}_saved" >/dev/null
    "$ucp" export --quiet "$o/atomic_${tag}_saved" "$o/hf_${tag}_saved" --to hf >/dev/null
    py samehf "$c" "hf_${tag}_saved" || fail=1
  done
  # The same weights as --ckpt-format torch_dist: each rank of real megatron-core loads its shards with
  # dist_checkpointing.load(model.sharded_state_dict()) at TP 1 x EP 2 x DP 2, and for mixtral and deepseek_v3
  # (MLA: column-parallel down projections) at TP 2 x EP 2 x expert-TP 1.
  degs="1 2 1 2"
  case $c in mixtral|deepseek_v3) degs="$degs,2 2 1 1";; esac
  IFS=, read -ra dl <<<"$degs"
  for d in "${dl[@]}"; do
    read -r tp ep etp dp <<<"$d"
    tag=mgdist_tp${tp}_ep${ep}_etp${etp}
    "$ucp" reshard --quiet "$o/atomic_hf" "$o/$tag" --to megatron --ckpt-format torch_dist --tp "$tp" --ep "$ep" \
      --expert-tp "$etp" --dp "$dp" --megatron-spec local
    py import "$c" "$tag" "$tp" "$ep" "$etp" "$dp" || fail=1
  done
done
exit $fail
