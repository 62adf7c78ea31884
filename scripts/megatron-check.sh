#!/usr/bin/env bash
# Real megatron-core loads what `ucp reshard --to megatron --ckpt-format torch_dist` writes, and what
# `--ckpt-format torch` writes from an MoE source (testdata/gen/megatron_dist_load.py: Megatron's own
# load_checkpoint, pretrain_gpt.py-style args parsed by Megatron), and what `--ckpt-format torch` writes
# from a Megatron-DeepSpeed source with its optimizer (testdata/check/megatron_torch_load.py): each case
# converts a real-core fixture of testdata/fixtures/megatron_dist, writes it at new degrees in the layout
# of MEGATRON_SRC's core, and has that megatron-core load it at those degrees on CPU (gloo, torch 2.6
# chroot of scripts/torch2-chroot.sh, the fixture generator's shims), compare every parameter and
# optimizer state with the fixture's live truth bit for bit, and take a training step.
#
#   scripts/megatron-check.sh MEGATRON_SRC [UCP_BIN]
#
# MEGATRON_SRC: a Megatron-LM release tag's tree (core_v0.19.0, core_v0.18.2 or core_v0.15.3).
# One Megatron run at a time, each under a watchdog (a rank can vanish on a busy machine), retried
# twice. Not run by CI (it needs Megatron's source). Prints one line per case; exit 1 if any failed.
# MEGATRON_CHECK_ONLY=REGEX runs only the cases whose line matches; MEGATRON_CHECK_TIME=0 skips the
# load-time measurement.
set -euo pipefail
src=${1:?usage: $0 MEGATRON_SRC [UCP_BIN]}
[ -d "$src/megatron/core" ] || { echo "megatron-check: $src has no megatron/core" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
ucp=${2:-$here/bin/ucp}
[ -x "$ucp" ] || (cd "$here" && go build -o "$ucp" ./cmd/ucp)
work=$(mktemp -d /var/tmp/ucp-megatron-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
cp -r "$src/megatron" "$work/src/"
cp "$here/testdata/gen/megatron_dist_fixtures.py" "$here/testdata/gen/megatron_dist_load.py" "$work/"
core=$(sed -n 's/^MAJOR = \([0-9]*\)/\1/p; s/^MINOR = \([0-9]*\)/\1/p' "$src/megatron/core/package_info.py" | paste -sd.)
fx=$here/testdata/fixtures/megatron_dist
# source fixture | generator case | TP PP DP written | optimizer sharding written (default fully_reshardable)
# | VPP written (model chunks per stage; default none) | layers of the first,last pipeline stage
# (--decoder-first/last-pipeline-num-layers; 0 not set; default an even split).
# | EP written (MoE fixtures; default the source's) | expert TP written (--expert-tp; default TP).
# Sharding distributed or plain writes --ckpt-format torch instead (mp_rank_* files, with distrib_optim.pt
# or Megatron's non-distributed optimizer; torch AdamW's per-parameter step), loaded with
# load_checkpoint --ckpt-format torch: the _local fixtures, whose args record the local spec, so that the
# legacy names are the ones a CPU run (no Transformer Engine) builds. ucp refuses the legacy format at
# expert TP > TP (two ranks of one (TP, EP) file would need different expert-TP cuts: Megatron names legacy
# files by TP and EP rank only) and, for now, the distributed optimizer at expert TP != TP.
# legacy:FIXTURE migrates formats: the fixture is first written by ucp as a legacy --ckpt-format torch
# save (TP 2 x DP 2, distributed optimizer: distrib_optim.pt, a layout real Megatron loads, RESHARD.md),
# and that legacy checkpoint is the source converted and written as torch_dist.
cases=(
  "core0_19_tp2_dp2_bf16_dprs tp2_dp2_bf16_dprs 1 1 4"
  "core0_19_tp2_dp2_bf16_dprs tp2_dp2_bf16_dprs 1 2 2"
  "core0_19_tp2_fp32_dprs tp2_fp32_dprs 2 2 1"
  "core0_14_tp2_dp2_bf16_fsms tp2_dp2_bf16_fsms 1 1 2"
  "core0_18_tp2_dp2_bf16_fullrs tp2_dp2_bf16_fullrs 1 1 2"
  "core0_15_tp2_dp2_bf16_fullrs tp2_dp2_bf16_fullrs 2 1 1"
  "core0_19_tp2_dp2_bf16_dprs tp2_dp2_bf16_dprs 1 1 4 dp_reshardable"
  "core0_19_tp2_dp2_bf16_dprs tp2_dp2_bf16_dprs 2 1 1 dp_reshardable"
  "core0_19_tp2_dp2_bf16_dprs tp2_dp2_bf16_dprs 1 2 2 dp_reshardable"
  "core0_19_tp2_pp2_tied_bf16_dprs_args tp2_pp2_tied_bf16_dprs_args 1 1 1"
  "core0_19_tp2_pp2_tied_bf16_dprs_args tp2_pp2_tied_bf16_dprs_args 1 1 2 dp_reshardable"
  "legacy:core0_19_tp2_dp2_bf16_fullrs tp2_dp2_bf16_fullrs 1 1 2"
  "core0_19_g4_tp2_dp2_bf16_dprs g4_tp2_dp2_bf16_dprs 4 1 1 dp_reshardable"
  "core0_19_g4_tp2_dp2_bf16_dprs g4_tp2_dp2_bf16_dprs 1 1 4 dp_reshardable"
  "core0_19_g4_tp2_dp2_bf16_dprs g4_tp2_dp2_bf16_dprs 4 1 1"
  "core0_19_g4_tp2_dp2_bf16_dprs g4_tp2_dp2_bf16_dprs 1 2 1 fully_reshardable 2"
  "core0_19_g4_tp2_dp2_bf16_dprs g4_tp2_dp2_bf16_dprs 1 2 1 dp_reshardable 2"
  "core0_19_g4_tp2_dp2_bf16_dprs g4_tp2_dp2_bf16_dprs 2 2 1 dp_reshardable 2"
  "core0_19_g4_tp2_dp2_bf16_dprs g4_tp2_dp2_bf16_dprs 1 2 1 fully_reshardable 0 1,0"
  "core0_19_g4_tp2_dp2_bf16_dprs g4_tp2_dp2_bf16_dprs 1 2 2 dp_reshardable 0 1,0"
  "core0_19_g4_tp2_dp2_bf16_dprs g4_tp2_dp2_bf16_dprs 1 3 1 dp_reshardable 0 0,2"
  "legacy:core0_19_tp2_dp2_bf16_fullrs tp2_dp2_bf16_fullrs 2 1 1 dp_reshardable"
  "core0_19_moe_tp2_ep2_fp32_fullrs moe_tp2_ep2_fp32_fullrs 2 1 2 fully_reshardable 0 0,0 1"
  "core0_19_moe_tp2_fp32_dprs moe_tp2_fp32_dprs 2 1 2 fully_reshardable 0 0,0 2"
  "core0_19_moe_tp2_ep2_fp32_fullrs moe_tp2_ep2_fp32_fullrs 1 1 2 fully_reshardable 0 0,0 2"
  "core0_19_moe_tp2_fp32_dprs moe_tp2_fp32_dprs 1 2 2 fully_reshardable 0 0,0 2"
  "core0_19_moe_tp2_ep2_fp32_dprs moe_tp2_ep2_fp32_dprs 2 1 2 dp_reshardable 0 0,0 1"
  "core0_19_moe_tp2_fp32_dprs moe_tp2_fp32_dprs 2 1 2 dp_reshardable 0 0,0 2"
  "core0_19_moe_tp2_ep2_fp32_fullrs moe_tp2_ep2_fp32_fullrs 1 1 4 dp_reshardable 0 0,0 2"
  "core0_19_moe_tp2_ep2_fp32_fullrs moe_tp2_ep2_fp32_fullrs 2 1 2 fully_reshardable 0 0,0 2 1"
  "core0_19_moe_tp2_ep2_fp32_fullrs moe_tp2_ep2_fp32_fullrs 2 1 2 dp_reshardable 0 0,0 2 1"
  "core0_19_moe_tp2_fp32_dprs moe_tp2_fp32_dprs 1 1 4 fully_reshardable 0 0,0 2 2"
  "core0_19_moe_tp2_ep2_fp32_fullrs_local moe_tp2_ep2_fp32_fullrs_local 2 1 2 distributed 0 0,0 1"
  "core0_19_moe_tp2_ep2_fp32_fullrs_local moe_tp2_ep2_fp32_fullrs_local 2 1 2 plain 0 0,0 1"
  "core0_19_moe_tp2_dp2_fp32_fullrs_local moe_tp2_dp2_fp32_fullrs_local 2 1 2 distributed 0 0,0 2"
  "core0_19_moe_tp2_dp2_fp32_fullrs_local moe_tp2_dp2_fp32_fullrs_local 2 1 2 plain 0 0,0 2"
  "core0_19_moe_tp2_ep2_fp32_fullrs_local moe_tp2_ep2_fp32_fullrs_local 2 1 2 plain 0 0,0 2 1"
  "core0_19_moe_tp2_ep2_ebias_bf16_fullrs_local moe_tp2_ep2_ebias_bf16_fullrs_local 2 1 2 fully_reshardable 0 0,0 1"
  "core0_19_moe_tp2_ep2_ebias_bf16_fullrs_local moe_tp2_ep2_ebias_bf16_fullrs_local 1 2 2 dp_reshardable 0 0,0 2"
  "core0_19_moe_tp2_ep2_ebias_bf16_fullrs_local moe_tp2_ep2_ebias_bf16_fullrs_local 2 1 2 plain 0 0,0 1"
  "core0_19_moe_tp2_ep2_ebias_bf16_fullrs_local moe_tp2_ep2_ebias_bf16_fullrs_local 1 2 2 distributed 0 0,0 2"
)
failed=0
for c in "${cases[@]}"; do
  [ -n "${MEGATRON_CHECK_ONLY:-}" ] && ! grep -Eq -- "$MEGATRON_CHECK_ONLY" <<<"$c" && continue
  read -r fixture gencase tp pp dp sharding vpp uneven ep etp <<<"$c"
  [ "${vpp:-0}" = 0 ] && vpp=
  IFS=, read -r first last <<<"${uneven:-0,0}"
  sharding=${sharding:-fully_reshardable}
  epflag=(); [ -n "$ep" ] && epflag=(--ep "$ep")
  [ -n "$etp" ] && epflag+=(--expert-tp "$etp")
  format=torch_dist; fmtflag=(--ckpt-format torch_dist --megatron-core "$core" --dist-optim-sharding "$sharding")
  case $sharding in
  distributed) format=torch; fmtflag=(--distributed-optimizer) ;;
  plain) format=torch; fmtflag=(--megatron-optimizer adamw) ;;
  esac
  tag=; [ "${fixture#legacy:}" != "$fixture" ] && tag=.legacy
  vflag=(); [ -n "$vpp" ] && vflag=(--vpp "$vpp") && tag=.vpp$vpp$tag
  [ "$first" != 0 ] && vflag+=(--decoder-first-pipeline-num-layers "$first") && tag=.first$first$tag
  [ "$last" != 0 ] && vflag+=(--decoder-last-pipeline-num-layers "$last") && tag=.last$last$tag
  dir=$work/${fixture#legacy:}.tp$tp.pp$pp.dp$dp${ep:+.ep$ep}${etp:+.etp$etp}.$sharding$tag
  mkdir -p "$dir"
  case $fixture in
  legacy:*)
    fixture=${fixture#legacy:}
    "$ucp" convert "$fx/$fixture/checkpoint" "$dir/atomic0" --quiet
    "$ucp" reshard "$dir/atomic0" "$dir/legacy" --to megatron --tp 2 --dp 2 --distributed-optimizer --quiet
    "$ucp" convert "$dir/legacy" "$dir/atomic" --quiet ;;
  *) "$ucp" convert "$fx/$fixture/checkpoint" "$dir/atomic" --quiet ;;
  esac
  "$ucp" reshard "$dir/atomic" "$dir/written" --to megatron "${fmtflag[@]}" \
    --tp "$tp" --pp "$pp" "${vflag[@]}" --dp "$dp" "${epflag[@]}" --quiet
  cp "$fx/$fixture/truth.pt" "$dir/"
  rel=${dir#"$work"/}
  ok=0
  for attempt in 1 2 3; do
    if timeout -k 10 400 "$here/scripts/torch2-chroot.sh" run "$work" env UCP_VPP="${vpp:-0}" UCP_FIRST_LAST="$first,$last" UCP_CKPT_FORMAT=$format UCP_ETP="${etp:-0}" python3 megatron_dist_load.py src "$rel" "$gencase" "$tp" "$pp" "$dp" "$sharding" $ep >"$dir/log" 2>&1; then
      ok=1; break
    fi
    grep -q '^FAIL' "$dir/log" && break # a real difference: no retry
    echo "megatron-check: $rel attempt $attempt failed, retrying" >&2
  done
  if [ $ok = 1 ]; then
    grep '^ok ' "$dir/log"
  else
    failed=1
    echo "FAIL core $core: $fixture -> $format TP $tp PP $pp${vpp:+ VPP $vpp} DP $dp${ep:+ EP $ep}${etp:+ expert-TP $etp} $sharding (first,last stage layers $first,$last)"; tail -30 "$dir/log"
  fi
done
# Megatron-DeepSpeed -> Megatron-LM with the optimizer: the llama-family Megatron-DeepSpeed fixture,
# resharded (local spec, torch AdamW's step) as --ckpt-format torch (non-distributed optimizer) and as
# torch_dist (fully_reshardable distributed optimizer), loaded by real megatron-core
# (testdata/check/megatron_torch_load.py: load_state_dict of the file, or dist_checkpointing.load of the
# model's and optimizer's sharded state dicts): weights, fp32 mains and Adam moments equal the fixture's
# truth bit for bit, step 3, one optimizer step. Case: name | format | TP | DP.
megds=$here/testdata/fixtures/deepspeed/megatron_llama_tp2_z1_bf16_dp4
cp "$here/testdata/check/megatron_torch_load.py" "$work/"
megds_cases=(
  "megds torch 2 1"
  "megds torch 1 1"
  "megds torch_dist 2 1"
  "megds torch_dist 1 2"
)
for c in "${megds_cases[@]}"; do
  [ -n "${MEGATRON_CHECK_ONLY:-}" ] && ! grep -Eq -- "$MEGATRON_CHECK_ONLY" <<<"$c" && continue
  read -r _ format tp dp <<<"$c"
  rel=megds.$format.tp$tp.dp$dp
  dir=$work/$rel
  mkdir -p "$dir"
  "$ucp" convert "$megds/checkpoint" "$dir/atomic" --quiet
  if [ "$format" = torch ]; then
    "$ucp" reshard "$dir/atomic" "$dir/written" --to megatron --tp "$tp" --megatron-spec local --megatron-optimizer adamw --quiet
  else
    "$ucp" reshard "$dir/atomic" "$dir/written" --to megatron --ckpt-format torch_dist --megatron-core "$core" \
      --tp "$tp" --dp "$dp" --megatron-spec local --megatron-optimizer adamw --quiet
  fi
  cp "$megds/truth.pt" "$dir/"
  if timeout -k 10 400 "$here/scripts/torch2-chroot.sh" run "$work" python3 megatron_torch_load.py src "$rel" "$tp" "$dp" "$format" >"$dir/log" 2>&1; then
    grep '^ok ' "$dir/log"
  else
    failed=1
    echo "FAIL core $core: Megatron-DeepSpeed megatron_llama_tp2_z1_bf16_dp4 -> Megatron $format TP $tp DP $dp"; tail -30 "$dir/log"
  fi
done
# Load time: Megatron loading ucp's output vs its own checkpoint of the same model at the same
# degrees (the fullrs case at TP 2 x DP 2, where its own core wrote it; UCP_OWN=1 loads Megatron's
# own). Each run's "load" figure is dist_checkpointing.load + load_state_dict on rank 0, fastest of
# MEGATRON_CHECK_ROUNDS (default 3) alternating rounds (own, ucp), both trees read once before, so
# that machine load and page cache affect both alike. MEGATRON_CHECK_TIME=1 (default) times the stored
# kilobyte fixture; =big first has MEGATRON_SRC's core write the same model at ~120 MB
# (scripts/megatron-big.sh); =DIR uses that script's earlier output DIR (same core); =0 skips it.
timing=${MEGATRON_CHECK_TIME:-1}
own=core${core/./_}_tp2_dp2_bf16_fullrs
geometry=
fxt=$fx
if [ "$timing" = big ]; then
  fxt=$work/big
  geometry=$("$here/scripts/megatron-big.sh" "$src" "$fxt") || echo "big model: generation failed"
elif [ -f "$timing/geometry" ]; then
  fxt=$timing # made before by scripts/megatron-big.sh with the same core
  geometry=$(cat "$timing/geometry")
fi
if [ -d "$fxt/$own" ] && [ "$timing" != 0 ]; then
  dir=$work/time && mkdir -p "$dir/own"
  "$ucp" convert "$fxt/$own/checkpoint" "$dir/atomic" --quiet
  "$ucp" reshard "$dir/atomic" "$dir/ucp/written" --to megatron --ckpt-format torch_dist --megatron-core "$core" --tp 2 --dp 2 --quiet
  cp -r "$fxt/$own/checkpoint" "$dir/own/written"
  cp "$fxt/$own/truth.pt" "$dir/own/"; cp "$fxt/$own/truth.pt" "$dir/ucp/"
  echo "load-time model: $(du -sb "$dir/own/written" | cut -f1) bytes (Megatron's save), $(du -sb "$dir/ucp/written" | cut -f1) bytes (ucp's)"
  # Both trees read once first: the rounds then find both in the page cache alike.
  find "$dir/own/written" "$dir/ucp/written" -type f -exec cat {} + >/dev/null
  rounds=${MEGATRON_CHECK_ROUNDS:-3}
  for round in $(seq "$rounds"); do
    for kind in own ucp; do
      o=0; [ $kind = own ] && o=1
      timeout -k 10 900 "$here/scripts/torch2-chroot.sh" run "$work" env UCP_OWN=$o UCP_DIRECT=1 UCP_MEGATRON_GEOMETRY=$geometry python3 megatron_dist_load.py src "time/$kind" tp2_dp2_bf16_fullrs 2 1 2 >"$dir/$kind.$round.log" 2>&1 || true
      sed -n "s/.*; load \([0-9.]*\)s.*/$kind \1/p" "$dir/$kind.$round.log" >>"$dir/times"
    done
  done
  echo "load times (s): $(paste -sd' ' "$dir/times")"
  awk '{ if (!($1 in best) || $2 < best[$1]) best[$1] = $2 }
       END { if (("own" in best) && ("ucp" in best)) printf "load time (fastest of '"$rounds"', rank 0): Megatron own checkpoint %.2fs, ucp output %.2fs, ratio %.2f\n", best["own"], best["ucp"], best["ucp"] / best["own"]; else print "load time: a run failed" }' "$dir/times"
fi
exit $failed
