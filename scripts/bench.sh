#!/usr/bin/env bash
# make bench: ucp convert against the I/O floor, `cp -r` of the same folder,
# page cache warm. Each case alternates, in this one process tree, REPEAT
# times: cp -r; ucp convert --no-sync; cp -r + sync; ucp convert (synced),
# and keeps the fastest of each (the machine may be shared). It prints wall,
# user and system seconds, the ratios to cp and ucp's peak RSS.
#
# Cases: the generated checkpoint (GPT-like, ZeRO-2 bf16, TP 2 x DP 4,
# 4.4 GB), the same model as ZeRO-3 bf16 (DP 4), a generated checkpoint of
# about twice the bytes (peak RSS must stay flat, time linear), a checkpoint
# written by the real DeepSpeed engine when UCP_BENCH_REAL names one, and
# ucp export --to hf against cp -r; sync of the same output bytes.
#
#   BENCH_DIR=.bench        where the checkpoints go (about 30 GB free needed)
#   BENCH_LAYERS=4          transformer layers of the generated model
#   BENCH_LAYERS2=10        layers of the doubled one (10: 1.97x the bytes of 4)
#   BENCH_MEMORY=1GiB       ucp's --memory budget
#   BENCH_REPEAT=3          rounds of each case; the fastest run counts
#   BENCH_ZERO3=1 BENCH_DOUBLE=1 BENCH_EXPORT=1   cases to run (0 skips)
#   BENCH_GENERATED=1       0: only UCP_BENCH_REAL
#   BENCH_CONVERT=1         0: skip ucp convert of the generated checkpoint (the other generated cases still run)
#   BENCH_SETTLE=touch      the page state every timed run starts from (see settle): touch (pre-touched memory,
#                           the floors at their fastest) or drain (this VM's steady state: free memory handed
#                           back to the host, every new page a host fault)
#   BENCH_CMDS=REGEX        only the command cases (BENCH_COMMANDS, BENCH_MEGATRON) whose name matches
#   BENCH_COMMANDS=1        verify, diff, export --to hf|torch|dcp, reshard --zero 1|2|3 and the Python
#                           load against their floors (cat, cp of the files read, cp -r, readinto)
#   BENCH_MEGATRON=1        reshard --to megatron (torch, then torch_dist) of a generated Llama source
#                           (benchgen --llama, BENCH_LLAMA_HIDDEN=1024, BENCH_LAYERS layers) vs cp -r
#   BENCH_NODES=0           1: also 4 nodes as 4 processes (output must equal 1 node's)
#   BENCH_MEGATRON_SRC=DIR  a Megatron-LM release tree (core_v0.19.0 ...): reshard --to megatron --ckpt-format
#                           torch_dist of the ~120 MB checkpoint its core writes (scripts/megatron-big.sh) vs cp -r
#   UCP_BENCH_REAL=DIR      a real DeepSpeed checkpoint (save folder or tag folder): the 255M-parameter
#                           GPT-like ZeRO-2 bf16 DP 2 one written by DeepSpeed's engine with
#                           /usr/bin/python3 scripts/bench-real.py --ds-src DeepSpeed-v0.14.5 --out DIR
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BENCH_DIR:-.bench}
LAYERS=${BENCH_LAYERS:-4}
LAYERS2=${BENCH_LAYERS2:-$((2 * LAYERS + 2))}
MEM=${BENCH_MEMORY:-1GiB}
REPEAT=${BENCH_REPEAT:-3}
UCP=bin/ucp
CORES=$(nproc)
mkdir -p "$B" bin
go build -o "$UCP" ./cmd/ucp
go build -o bin/benchgen ./internal/cmd/benchgen
# the Python load row loads this tree's C library, never one an older build left
go build -buildmode=c-shared -o python/ucp/libucp.so ./capi
: > "$B/log"
T0=${EPOCHREALTIME}

gb() { awk -v b="$1" 'BEGIN{printf "%.2f GB", b/1e9}'; }
mb() { awk -v b="$1" 'BEGIN{printf "%.0f MB", b/1e6}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
json() { # json FILE KEY: a top-level number from a report
  grep -o "\"$2\": [0-9.e+]*" "$1" | head -1 | awk '{print $2}'
}
gen() { # gen DIR ARGS...: a generated checkpoint, kept between runs
  local dir=$1; shift
  if [ ! -f "$dir/latest" ]; then
    rm -rf "$dir"
    bin/benchgen --out "$dir" "$@"
  fi
}
warm() { find "$1" -type f -exec cat {} + > /dev/null; }

# settle: run before every timed run, floor and ucp alike. It reads the
# inputs in WARM again (the page cache is warm by the time a command starts,
# even where the kernel pages out cold file pages, as DAMON's reclaim does on
# the VMs this was measured on). Then, on a VM that hands free pages back to
# its host (virtio-balloon free page reporting), where the first touch of a
# page costs a host fault (several seconds of system time for a few GB, which
# would otherwise land at random on whichever command allocates next), it
# sets one of two states:
#   touch (default): touches BENCH_PREFAULT_MB of memory where /dev/shm has
#     room and frees it. The kernel reports freed memory to the host about
#     2 s later, so a command's allocations in its first ~2 s are cheap and
#     later ones are not: this favours the floor (cp allocates the whole copy
#     in its first 0.6 s; ucp's writers run longer).
#   drain: waits until the kernel has reported its free memory (reported_kib
#     steady for 0.5 s, at most 20 s): every new page of floor and ucp alike
#     is a host fault, as for any job on this VM once it has run a few seconds.
WARM=()
PREFAULT_MB=${BENCH_PREFAULT_MB:-4096}
SETTLE=${BENCH_SETTLE:-touch}
REPORTED=/sys/module/page_reporting/parameters/reported_kib
settle() {
  local d
  for d in "${WARM[@]}"; do warm "$d"; done
  if [ "$SETTLE" = drain ]; then
    sleep 2.5 # the kernel's page reporting runs 2 s after memory is freed
    if [ -r "$REPORTED" ]; then
      local a b i
      b=$(cat "$REPORTED")
      for i in $(seq 35); do sleep 0.5; a=$(cat "$REPORTED"); [ "$a" = "$b" ] && break; b=$a; done
    fi
  elif [ "$PREFAULT_MB" -gt 0 ] && [ "$(df -m --output=avail /dev/shm 2>/dev/null | tail -1)" -gt "$PREFAULT_MB" ] 2>/dev/null; then
    dd if=/dev/zero of=/dev/shm/ucp-bench-prefault bs=1M count="$PREFAULT_MB" status=none
    rm -f /dev/shm/ucp-bench-prefault
  fi
}
case $SETTLE in touch|drain) ;; *) echo "bench: BENCH_SETTLE must be touch or drain, not $SETTLE" >&2; exit 2 ;; esac

# timed FILE CMD...: runs CMD and appends "wall user sys" (seconds, children
# included) to FILE; CMD's output goes to the log.
timed() {
  local file=$1; shift
  local t
  t=$( { TIMEFORMAT='%R %U %S'; time "$@" >>"$B/log" 2>&1; } 2>&1 ) || {
    echo "failed: $* (see $B/log)" >&2; tail -5 "$B/log" >&2; exit 1; }
  echo "$t" >> "$file"
}
fastest() { sort -n "$1" | head -1; } # the run with the least wall time

copy() { cp -r "$1" "$2"; }
copysync() { cp -r "$1" "$2" && sync; }
ucp() { # ucp SRC DST REPORT ARGS...
  local src=$1 dst=$2 rep=$3; shift 3
  "$UCP" convert --quiet --force --memory "$MEM" --workers "$CORES" --report "$rep" "$@" "$src" "$dst"
}
clean() { rm -rf "$B/cp" "$B/out" "$B/out.partial" "$B/latest_universal"; sync; }

# bench NAME SRC: the four runs, alternating, REPEAT rounds; prints the table.
bench() {
  local name=$1 src=$2 bytes r
  bytes=$(du -sb "$src" | cut -f1)
  WARM=("$src")
  rm -f "$B"/t.* "$B"/rss.*
  for r in $(seq "$REPEAT"); do
    clean; settle; timed "$B/t.cp" copy "$src" "$B/cp"
    clean; settle; timed "$B/t.nosync" ucp "$src" "$B/out" "$B/report.json" --no-sync
    json "$B/report.json" peak_rss_bytes >> "$B/rss.nosync"
    clean; settle; timed "$B/t.cpsync" copysync "$src" "$B/cp"
    clean; settle; timed "$B/t.sync" ucp "$src" "$B/out" "$B/report.json"
    json "$B/report.json" peak_rss_bytes >> "$B/rss.sync"
  done
  clean
  local cp nosync cpsync synced rss
  read -r -a cp <<< "$(fastest "$B/t.cp")"
  read -r -a nosync <<< "$(fastest "$B/t.nosync")"
  read -r -a cpsync <<< "$(fastest "$B/t.cpsync")"
  read -r -a synced <<< "$(fastest "$B/t.sync")"
  rss=$(sort -n "$B/rss.nosync" "$B/rss.sync" | tail -1)
  echo
  echo "$name: $src, $(gb "$bytes"), $CORES cores, --memory $MEM, best of $REPEAT"
  printf '  %-30s %7s %7s %7s %9s\n' run wall user sys "x floor"
  printf '  %-30s %7s %7s %7s %9s\n' "cp -r" "${cp[@]}" 1.00
  printf '  %-30s %7s %7s %7s %9s\n' "ucp convert --no-sync" "${nosync[@]}" "$(ratio "${nosync[0]}" "${cp[0]}")"
  printf '  %-30s %7s %7s %7s %9s\n' "cp -r; sync" "${cpsync[@]}" 1.00
  printf '  %-30s %7s %7s %7s %9s\n' "ucp convert (synced)" "${synced[@]}" "$(ratio "${synced[0]}" "${cpsync[0]}")"
  printf '  peak RSS %s; %.2f s/GB without sync\n' "$(mb "$rss")" "$(awk -v t="${nosync[0]}" -v b="$bytes" 'BEGIN{print t/(b/1e9)}')"
  printf '%s %s %s\t%s\n' "$bytes" "${nosync[0]}" "$rss" "$name" >> "$B/summary"
}

# wanted NAME...: whether BENCH_CMDS selects any of the named cases.
wanted() {
  local n
  for n; do [[ "$n" =~ ${BENCH_CMDS:-.} ]] && return 0; done
  return 1
}

# cmdcase NAME FLOOR-FN UCP-ARGS...: alternates the floor and the ucp command
# REPEAT times; prints the fastest of each, the ratio and ucp's peak RSS.
cmdcase() {
  local name=$1 floorfn=$2 r; shift 2
  wanted "$name" || return 0
  rm -f "$B"/t.f "$B"/t.u "$B"/rss.u
  for r in $(seq "$REPEAT"); do
    rm -rf "$B/cmdout" "$B/cmdcp"; sync; settle
    timed "$B/t.f" "$floorfn"
    rm -rf "$B/cmdout" "$B/cmdcp"; sync
    /usr/bin/time -f '%M' -o "$B/rss.one" "$UCP" "$@" >>"$B/log" 2>&1 || [ "$1" = diff ] || { echo "failed: ucp $*" >&2; tail -5 "$B/log" >&2; exit 1; }
    rm -rf "$B/cmdout" "$B/cmdcp"; sync; settle
    timed "$B/t.u" "$UCP" "$@" || true
    cat "$B/rss.one" >> "$B/rss.u"
  done
  local f u
  read -r -a f <<< "$(fastest "$B/t.f")"
  read -r -a u <<< "$(fastest "$B/t.u")"
  printf '  %-54s %7s %7s %7s   floor %7s %7s %7s  %6sx  %s  load %s\n' "$name" "${u[@]}" "${f[@]}" "$(ratio "${u[0]}" "${f[0]}")" \
    "$(mb "$(( $(sort -n "$B/rss.u" | tail -1) * 1024 ))")" "$(cut -d' ' -f1 /proc/loadavg)"
}

fcpa() { cp -r "$A" "$B/cmdcp" && sync; } # reshard's floor: cp -r of the atomic checkpoint read; sync
# outfloor DIR: makes fcpo, cp -r of DIR (a writer's output, made beforehand with --no-sync); sync, the floor
# of writing the same bytes, the one floor for the rows marked [floor: its output]; prints DIR's size.
outfloor() {
  OUT=$1
  echo "  (output $(gb "$(du -sb "$OUT" | cut -f1)"), atomic checkpoint read $(gb "$(du -sb "$A" | cut -f1)"))"
}
fcpo() { cp -r "$OUT" "$B/cmdcp" && sync; }

# megatron SRC: reshard --to megatron of a generated Llama source (Megatron-DeepSpeed layout with its
# training arguments: a model family Megatron knows) at --ckpt-format torch, then of that Megatron
# checkpoint's conversion at --ckpt-format torch_dist (ucp writes torch_dist from a Megatron source),
# each against cp -r of the atomic checkpoint it reads; sync.
megatron() {
  local src=$1
  ucp "$src" "$B/atomic" "$B/report.json" > /dev/null
  A=$B/atomic
  WARM=("$A")
  echo
  echo "generated Llama, reshard --to megatron, best of $REPEAT (wall user sys; floor wall user sys; ratio; ucp peak RSS; 1-min load average after)"
  local v
  for v in "" "--verify=false"; do # as in commands: as users run it, and without the read-back
    cmdcase "reshard --to megatron torch${v:+ $v}" fcpa reshard --quiet --force --to megatron --tp 2 --dp 2 $v "$A" "$B/cmdout"
  done
  rm -rf "$B/meg"
  "$UCP" reshard --quiet --force --no-sync --to megatron --tp 2 --dp 2 "$A" "$B/meg"
  rm -rf "$B/atomic"
  ucp "$B/meg" "$B/atomic" "$B/report.json" > /dev/null
  rm -rf "$B/meg"
  # torch_dist holds the bf16 weights besides the fp32 ones (14 bytes a parameter, the atomic checkpoint
  # 12): its output is 1.17x the bytes cp -r copies. The rows run against both floors: cp -r; sync of the
  # atomic checkpoint read (fcpa), and of the output (fcpo).
  rm -rf "$B/megout"
  "$UCP" reshard --quiet --force --no-sync --to megatron --ckpt-format torch_dist --tp 2 --dp 2 "$A" "$B/megout"
  outfloor "$B/megout"
  WARM=("$A" "$B/megout")
  local floor tag
  for floor in fcpa fcpo; do
    tag=; [ "$floor" = fcpo ] && tag=" [floor: its output]"
    for v in "" "--verify=false"; do
      cmdcase "reshard --to megatron torch_dist${v:+ $v}$tag" "$floor" reshard --quiet --force --to megatron \
        --ckpt-format torch_dist --tp 2 --dp 2 $v "$A" "$B/cmdout"
    done
  done
  rm -rf "$B/atomic" "$B/cmdout" "$B/cmdcp" "$B/megout"
}

# commands NAME SRC: every other command against its floor on SRC and its conversion.
commands() {
  local name=$1 src=$2
  ucp "$src" "$B/atomic" "$B/report.json" > /dev/null
  A=$B/atomic S=$src
  WARM=("$A" "$src")
  echo
  echo "$name: the other commands, best of $REPEAT (wall user sys; floor wall user sys; ratio; ucp peak RSS; 1-min load average after)"
  fcat() { find "$A" -type f -exec cat {} + > /dev/null; }
  fcat2() { find "$S" "$A" -type f -exec cat {} + > /dev/null; }
  # export reads the fp32 weights; its floor copies exactly those files.
  # export and reshard sync what they write: so do their floors.
  fweights() { mkdir -p "$B/cmdcp" && find "$A/zero" -name fp32.pt -exec cp --parents -t "$B/cmdcp" {} + && sync; }
  # export --to dcp reads every optimizer state too: its floor copies zero/.
  fzero() { mkdir -p "$B/cmdcp" && cp -r "$A/zero" "$B/cmdcp" && sync; }
  cmdcase "verify" fcat verify "$A"
  cmdcase "diff SRC ATOMIC" fcat2 diff --memory "$MEM" "$S" "$A"
  for to in hf torch; do
    cmdcase "export --to $to" fweights export --quiet --force --to $to --arch none --memory "$MEM" "$A" "$B/cmdout"
  done
  # The reshard and DCP rows run twice: as users run them (--verify, which reads every byte it copies back
  # to check the atomic source) and with --verify=false, which does the floor's work (cp checks nothing):
  # its copies take their CRC-32 from the manifest's block CRCs (internal/atomic/FORMAT.md, block_crc32).
  for v in "" "--verify=false"; do
    cmdcase "export --to dcp${v:+ $v}" fzero export --quiet --force --to dcp $v "$A" "$B/cmdout"
    for z in 1 2 3; do
      cmdcase "reshard --to deepspeed --zero $z --dp 3${v:+ $v}" fcpa reshard --force --to deepspeed --zero $z --dp 3 $v "$A" "$B/cmdout/global_step1"
    done
  done
  # A synced write is bound by its bytes (README, "What bounds a synced writer"): the same rows against
  # cp -r; sync of their own output, as many bytes at ZeRO 1 and 2 (the atomic checkpoint of a DeepSpeed
  # source keeps the bf16 model states), fewer at ZeRO 3.
  local z name
  for z in 1 2 3; do
    name="reshard --to deepspeed --zero $z --dp 3"
    wanted "$name [floor: its output]" "$name --verify=false [floor: its output]" || continue
    rm -rf "$B/dsout"
    "$UCP" reshard --quiet --force --no-sync --to deepspeed --zero $z --dp 3 "$A" "$B/dsout/global_step1"
    WARM=("$A" "$B/dsout")
    outfloor "$B/dsout"
    for v in "" "--verify=false"; do
      cmdcase "$name${v:+ $v} [floor: its output]" fcpo reshard --force --to deepspeed --zero $z --dp 3 $v "$A" "$B/cmdout/global_step1"
    done
    WARM=("$A" "$src")
    rm -rf "$B/dsout"
  done
  if [ -f python/ucp/libucp.so ] && wanted "python load_state_dict"; then
    # a failed load stops the bench (a -nan row would read as a measurement)
    out=$(/usr/bin/python3 scripts/bench_load.py "$A" "$REPEAT") || { echo "bench: scripts/bench_load.py failed on $A" >&2; exit 1; }
    read -r fl us rf ru <<< "$(awk '{print $2, $4, $6, $8}' <<< "$out")"
    printf '  %-54s %7s %23s   floor %7s %15s  %6sx  %s\n' "python load_state_dict (3 states)" "$us" "" "$fl" "" "$(ratio "$us" "$fl")" "$(mb "$ru")"
  fi
  rm -rf "$B/atomic" "$B/cmdout" "$B/cmdcp" "$B/latest_universal" "$B/latest"
}

: > "$B/summary"
if [ "${BENCH_GENERATED:-1}" = 1 ]; then
gen "$B/src" --layers "$LAYERS"
[ "${BENCH_CONVERT:-1}" = 1 ] && bench "generated ZeRO-2 bf16, TP 2 x DP 4" "$B/src"
[ "${BENCH_COMMANDS:-1}" = 1 ] && commands "generated ZeRO-2 bf16, TP 2 x DP 4" "$B/src"

if [ "${BENCH_EXPORT:-1}" = 1 ] && [ -f "$B/src/latest" ]; then
  # ucp export --to hf (bf16, synced) against cp -r; sync of the same output bytes.
  ucp "$B/src" "$B/atomic" "$B/report.json" > /dev/null
  WARM=("$B/atomic")
  rm -f "$B"/t.*
  for r in $(seq "$REPEAT"); do
    rm -rf "$B/hf"; sync; settle
    timed "$B/t.export" "$UCP" export --quiet --force --to hf --arch none --dtype bfloat16 --memory "$MEM" --verify=false "$B/atomic" "$B/hf"
    rm -rf "$B/hfcp"; sync; WARM=("$B/hf"); settle; WARM=("$B/atomic")
    timed "$B/t.hfcp" copysync "$B/hf" "$B/hfcp"
  done
  read -r -a ex <<< "$(fastest "$B/t.export")"
  read -r -a excp <<< "$(fastest "$B/t.hfcp")"
  echo
  echo "ucp export --to hf --dtype bfloat16 of the converted checkpoint ($(gb "$(du -sb "$B/hf" | cut -f1)") written), best of $REPEAT"
  printf '  %-30s %7s %7s %7s %9s\n' run wall user sys "x floor"
  printf '  %-30s %7s %7s %7s %9s\n' "cp -r; sync of its output" "${excp[@]}" 1.00
  printf '  %-30s %7s %7s %7s %9s\n' "ucp export (synced)" "${ex[@]}" "$(ratio "${ex[0]}" "${excp[0]}")"
  rm -rf "$B/hf" "$B/hfcp" "$B/atomic" "$B/latest_universal"
fi

if [ "${BENCH_NODES:-0}" = 1 ]; then
  # Four simulated nodes: four processes sharing one output folder.
  ucp "$B/src" "$B/one" "$B/report.json" --no-sync > /dev/null
  rm -rf "$B/out4" "$B/out4.partial"; sync
  t0=${EPOCHREALTIME}
  for n in 0 1 2 3; do
    "$UCP" convert --quiet --memory "$MEM" --workers 1 --no-sync --num-nodes 4 --node-rank $n \
      --report "$B/report-node$n.json" "$B/src" "$B/out4" &
  done
  wait
  t1=${EPOCHREALTIME}
  SAME=yes
  (cd "$B/one" && find . -type f ! -name ucp.json | sort) > "$B/files.txt"
  while read -r f; do cmp -s "$B/one/$f" "$B/out4/$f" || { SAME="no ($f differs)"; break; }; done < "$B/files.txt"
  echo
  echo "4 nodes x 1 worker (processes), --no-sync: $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}') s; output identical to 1 node: $SAME"
  rm -rf "$B/one" "$B/out4" "$B/latest_universal"
fi

fi

if [ "${BENCH_MEGATRON:-1}" = 1 ] && [ "${BENCH_GENERATED:-1}" = 1 ]; then
  gen "$B/llama" --llama --hidden "${BENCH_LLAMA_HIDDEN:-1024}" --layers "$LAYERS"
  megatron "$B/llama"
fi

if [ "${BENCH_ZERO3:-1}" = 1 ] && [ "${BENCH_GENERATED:-1}" = 1 ]; then
  gen "$B/z3" --layers "$LAYERS" --zero3 --dp 4
  bench "generated ZeRO-3 bf16, DP 4" "$B/z3"
fi

if [ "${BENCH_DOUBLE:-1}" = 1 ] && [ "${BENCH_GENERATED:-1}" = 1 ]; then
  gen "$B/src2" --layers "$LAYERS2"
  bench "generated ZeRO-2 bf16, TP 2 x DP 4, $LAYERS2 layers" "$B/src2"
fi

if [ -n "${UCP_BENCH_REAL:-}" ]; then
  bench "real DeepSpeed checkpoint" "$UCP_BENCH_REAL"
  [ "${BENCH_COMMANDS:-1}" = 1 ] && commands "real DeepSpeed checkpoint" "$UCP_BENCH_REAL"
fi

if [ -n "${BENCH_MEGATRON_SRC:-}" ]; then
  # reshard --to megatron --ckpt-format torch_dist (synced) of a torch_dist checkpoint real megatron-core
  # wrote (~120 MB, scripts/megatron-big.sh with BENCH_MEGATRON_SRC's core; kept between runs), converted
  # once, at the source's degrees, against cp -r; sync of that source folder.
  M=$B/megatron
  [ -d "$M"/core*_tp2_dp2_bf16_fullrs ] 2>/dev/null || scripts/megatron-big.sh "$BENCH_MEGATRON_SRC" "$M" > /dev/null
  MS=$(echo "$M"/core*_tp2_dp2_bf16_fullrs/checkpoint)
  mcore=$(basename "$(dirname "$MS")" | sed 's/^core\([0-9]*\)_\([0-9]*\)_.*/\1.\2/')
  rm -rf "$B/atomic"
  "$UCP" convert --quiet "$MS" "$B/atomic"
  A=$B/atomic
  WARM=("$A" "$MS")
  echo
  echo "real megatron-core $mcore torch_dist checkpoint ($(mb "$(du -sb "$MS" | cut -f1)")), best of $REPEAT (wall user sys; floor wall user sys; ratio; ucp peak RSS; 1-min load average after)"
  fcpm() { cp -r "$MS" "$B/cmdcp" && sync; }
  cmdcase "reshard --to megatron torch_dist" fcpm reshard --quiet --force --to megatron --ckpt-format torch_dist \
    --megatron-core "$mcore" --tp 2 --dp 2 "$A" "$B/cmdout"
  rm -rf "$B/atomic" "$B/cmdout" "$B/cmdcp"
fi

if [ "${BENCH_RING:-1}" = 1 ]; then
  # transport="ucp"'s CPU exchange between two processes, each way at once as a group load runs it
  # (internal/load/ringbench_test.go): the ring as it runs on one host (process_vm_readv), the ring on TCP
  # only (as between hosts), and the floor measured in the same run: plain TCP streams both ways between the
  # same two processes over the same buffers. MB/s received per rank (each rank also sends as much).
  go test -count=1 -run '^$' -bench 'TwoProcesses' -benchtime 4x ./internal/load > "$B/ring.txt" 2>&1 ||
    { cat "$B/ring.txt" >&2; exit 1; }
  ring=$(awk '/RingTwoProcesses/ {print $(NF-1)}' "$B/ring.txt")
  tcp=$(awk '/RingTCPTwoProcesses/ {print $(NF-1)}' "$B/ring.txt")
  floor=$(awk '/StreamTwoProcesses/ {print $(NF-1)}' "$B/ring.txt")
  echo
  echo "CPU ring, 2 processes, MB/s received per rank: same host $ring ($(ratio "$ring" "$floor")x the floor), TCP only $tcp ($(ratio "$tcp" "$floor")x); floor (plain TCP streams both ways) $floor"
fi

echo
echo "scaling (--no-sync): bytes, seconds per GB and peak RSS relative to the first case"
awk -F'\t' '{split($1, v, " "); if (NR==1) {b0=v[1]; s0=v[2]/v[1]; r0=v[3]}
  printf "  %-46s x%.2f bytes  x%.2f s/GB  x%.2f RSS\n", $2, v[1]/b0, (v[2]/v[1])/s0, v[3]/r0}' "$B/summary"
echo "bench took $(awk -v a="$T0" -v b="${EPOCHREALTIME}" 'BEGIN{printf "%.0f", b-a}') s (BENCH_SETTLE=$SETTLE)"
