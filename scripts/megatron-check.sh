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
# load-time measurement (below).
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
mkdir -p "$work/cpu_shims" && cp "$here/testdata/gen/cpu_shims/"{fused_adam,six}.py "$work/cpu_shims/"
core=$(sed -n 's/^MAJOR = \([0-9]*\)/\1/p; s/^MINOR = \([0-9]*\)/\1/p' "$src/megatron/core/package_info.py" | paste -sd.)
# Core 0.15's dp_reshardable needs a fused Adam (the step in the param groups, as TE/Apex keep it; its
# bucket state dict refuses torch AdamW's per-parameter step): the Megatron runs of the cases then import
# the CPU stand-in testdata/gen/cpu_shims/fused_adam.py as Apex's FusedAdam (MEGATRON_CHECK_FUSED_ADAM=1,
# default for core 0.15), and ucp writes the step where it keeps it (--megatron-optimizer fused).
fused=${MEGATRON_CHECK_FUSED_ADAM:-$([ "$core" = 0.15 ] && echo 1 || echo 0)}
optflag=(); label=; [ "$fused" = 1 ] && optflag=(--megatron-optimizer fused) && label=" (cpu_shims FusedAdam)"
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
  format=torch_dist; fmtflag=(--ckpt-format torch_dist --megatron-core "$core" --dist-optim-sharding "$sharding" "${optflag[@]}")
  case $sharding in
  distributed) format=torch; fmtflag=(--distributed-optimizer "${optflag[@]}") ;;
  plain) format=torch; fmtflag=(--megatron-optimizer "$([ "$fused" = 1 ] && echo fused || echo adamw)") ;;
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
    if timeout -k 10 400 "$here/scripts/torch2-chroot.sh" run "$work" env UCP_FUSED_ADAM="$fused" UCP_VPP="${vpp:-0}" UCP_FIRST_LAST="$first,$last" UCP_CKPT_FORMAT=$format UCP_ETP="${etp:-0}" python3 megatron_dist_load.py src "$rel" "$gencase" "$tp" "$pp" "$dp" "$sharding" $ep >"$dir/log" 2>&1; then
      ok=1; break
    fi
    grep -q '^FAIL' "$dir/log" && break # a real difference: no retry
    echo "megatron-check: $rel attempt $attempt failed, retrying" >&2
  done
  if [ $ok = 1 ]; then
    grep '^ok ' "$dir/log"
  else
    failed=1
    echo "FAIL core $core${label}: $fixture -> $format TP $tp PP $pp${vpp:+ VPP $vpp} DP $dp${ep:+ EP $ep}${etp:+ expert-TP $etp} $sharding (first,last stage layers $first,$last)"; tail -30 "$dir/log"
  fi
done
# Megatron-DeepSpeed -> Megatron-LM with the optimizer: the llama-family Megatron-DeepSpeed fixture,
# resharded (local spec, torch AdamW's step) as --ckpt-format torch (non-distributed optimizer) and as
# torch_dist (fully_reshardable distributed optimizer), loaded by real megatron-core
# (testdata/check/megatron_torch_load.py: Megatron's own load_checkpoint with pretrain_gpt.py
# args parsed by Megatron): weights, fp32 mains and Adam moments equal the fixture's
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
  adam=adamw; [ "$fused" = 1 ] && adam=fused
  if [ "$format" = torch ]; then
    "$ucp" reshard "$dir/atomic" "$dir/written" --to megatron --tp "$tp" --megatron-spec local --megatron-optimizer $adam --quiet
  else
    "$ucp" reshard "$dir/atomic" "$dir/written" --to megatron --ckpt-format torch_dist --megatron-core "$core" \
      --tp "$tp" --dp "$dp" --megatron-spec local --megatron-optimizer $adam --quiet
  fi
  cp "$megds/truth.pt" "$dir/"
  if timeout -k 10 400 "$here/scripts/torch2-chroot.sh" run "$work" env UCP_FUSED_ADAM="$fused" python3 megatron_torch_load.py src "$rel" "$tp" "$dp" "$format" >"$dir/log" 2>&1; then
    grep '^ok ' "$dir/log"
  else
    failed=1
    echo "FAIL core $core$label: Megatron-DeepSpeed megatron_llama_tp2_z1_bf16_dp4 -> Megatron $format TP $tp DP $dp"; tail -30 "$dir/log"
  fi
done
# Load time: Megatron's load of ucp's output against its own checkpoint of the same model at the same
# degrees (scripts/megatron-loadtime.sh: both loaded alternately in one run, wall and CPU time).
# MEGATRON_CHECK_TIME=1 (default) times the stored kilobyte fixture; =big a ~125 MB model written by
# MEGATRON_SRC's core first (scripts/megatron-big.sh, in the work folder); =DIR that script's output DIR
# (same core; written there when DIR has none); =0 skips it.
timing=${MEGATRON_CHECK_TIME:-1}
case $timing in
0) ;;
1) "$here/scripts/megatron-loadtime.sh" "$src" "" "$ucp" || failed=1 ;;
big) "$here/scripts/megatron-loadtime.sh" "$src" "$work/big" "$ucp" || failed=1 ;;
*) "$here/scripts/megatron-loadtime.sh" "$src" "$timing" "$ucp" || failed=1 ;;
esac
exit $failed
