#!/usr/bin/env bash
# make scale: the scale proof of issue 28, not part of make test. A generated
# ZeRO-2 bf16 checkpoint (benchgen, TP 2 x DP 4) of SCALE_SMALL layers
# (16: 12.85 GB) and one of SCALE_BIG layers (34: 25.56 GB, 1.99x the
# bytes) are each converted, cold (every source file dropped from the page
# cache first with dd iflag=nocache) and synced, in three ways:
#   floor  cp -r SRC OUT && sync
#   one    ucp convert --workers $(nproc) SRC OUT            (one node)
#   nodes  mpirun -n 3 ... ucp convert --workers 1 SRC OUT   (3 node-processes,
#          rank and count from Open MPI; the manifest must equal one node's)
# Wall, user and system seconds and peak RSS come from /usr/bin/time (the
# nodes' CPU is summed, their RSS is the largest process's); the 1-minute
# load average is recorded with each run. The sizes alternate, small big big
# small ... (ABBA) over SCALE_ROUNDS rounds so that a changing load affects
# both; only one source is on disk at a time (they are regenerated when the
# size changes) and each output is deleted before the next run, so the disk
# needs about 2x the big checkpoint plus SCALE_MIN_FREE_GB GiB free; the script
# stops before a run that would leave less. Results: $D/results.tsv, and a
# summary (best wall of each) on stdout. Everything it wrote is removed at the
# end unless SCALE_KEEP=1.
#
#   SCALE_DIR=.bench/scale  SCALE_SMALL=16  SCALE_BIG=34  SCALE_ROUNDS=2  SCALE_HIDDEN=2048
#   SCALE_MEMORY=1GiB       SCALE_NODES=3   SCALE_MIN_FREE_GB=10  SCALE_KEEP=0
set -euo pipefail
cd "$(dirname "$0")/.."
D=${SCALE_DIR:-.bench/scale}
SMALL=${SCALE_SMALL:-16}
BIG=${SCALE_BIG:-34}
HIDDEN=${SCALE_HIDDEN:-2048}
ROUNDS=${SCALE_ROUNDS:-2}
MEM=${SCALE_MEMORY:-1GiB}
NODES=${SCALE_NODES:-3}
MINFREE=${SCALE_MIN_FREE_GB:-10}
CORES=$(nproc)
UCP=$PWD/bin/ucp
mkdir -p "$D" bin
go build -o "$UCP" ./cmd/ucp
go build -o bin/benchgen ./internal/cmd/benchgen
command -v mpirun > /dev/null || { echo "scale: mpirun not found (apt-get install openmpi-bin)" >&2; exit 1; }
RES=$D/results.tsv
[ -f "$RES" ] || printf 'date\tlayers\tbytes\trun\twall\tuser\tsys\tpeak_rss_kb\tload1\tout_bytes\tload_end\n' > "$RES"
cleanup() { [ "${SCALE_KEEP:-0}" = 1 ] || rm -rf "$D"/src* "$D"/out "$D"/out.partial "$D"/latest_universal "$D"/t.*; }
trap cleanup EXIT

freeb() { df -B1 --output=avail "$D" | tail -1 | tr -d ' '; }
load1() { cut -d' ' -f1 /proc/loadavg; }
evict() { find "$1" -type f -exec dd iflag=nocache count=0 status=none if={} \; ; }
clean() { rm -rf "$D/out" "$D/out.partial" "$D/latest_universal"; sync; }

# source L: the checkpoint of L layers, the only one on disk.
source_of() {
  local l=$1 s=$D/src$1
  if [ ! -f "$s/latest" ]; then
    rm -rf "$D"/src*; sync
    bin/benchgen --out "$s" --layers "$l" --hidden "$HIDDEN" >&2
    sync
  fi
  echo "$s"
}

# record L BYTES RUN LOAD TIMEFILES...: one row; wall from the first file,
# CPU summed over the others (or the first when alone), RSS the largest;
# LOAD is the load average when the run started, load_end when it ended.
record() {
  local l=$1 bytes=$2 run=$3 load=$4; shift 4
  local wall ob
  wall=$(tail -1 "$1" | cut -d' ' -f1)
  ob=$(du -sb "$D/out" | cut -f1)
  [ $# -gt 1 ] && shift
  tail -q -n1 "$@" | awk -v d="$(date -u +%FT%TZ)" -v l="$l" -v b="$bytes" -v r="$run" -v w="$wall" -v ld="$load" -v ob="$ob" -v le="$(load1)" \
    '{u += $2; s += $3; if ($4 > m) m = $4} END {printf "%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%d\t%s\t%s\t%s\n", d, l, b, r, w, u, s, m, ld, ob, le}' \
    | tee -a "$RES"
}

tm() { local o=$1; shift; /usr/bin/time -f '%e %U %S %M' -o "$o" "$@"; }
runs() { # runs L: the three runs on the L-layer checkpoint
  local l=$1 src bytes need load i
  src=$(source_of "$l")
  bytes=$(du -sb "$src" | cut -f1)
  for run in floor one nodes; do
    clean
    need=$(( bytes + (MINFREE << 30) )) # df -h's G: GiB
    if [ "$(freeb)" -lt "$need" ]; then
      echo "scale: $(( $(freeb) >> 30 )) GiB free, a $run run of $src needs $(( need >> 30 )) GiB (SCALE_MIN_FREE_GB=$MINFREE); stopping" >&2
      exit 1
    fi
    evict "$src"
    load=$(load1)
    rm -f "$D"/t.*
    case $run in
    floor) tm "$D/t.0" sh -c 'cp -r "$1" "$2" && sync' sh "$src" "$D/out"
      record "$l" "$bytes" "$run" "$load" "$D/t.0" ;;
    one) tm "$D/t.0" "$UCP" convert --quiet --memory "$MEM" --workers "$CORES" "$src" "$D/out"
      jq -S '{params, files}' "$D/out/ucp.json" > "$D/manifest.$l"
      record "$l" "$bytes" "$run" "$load" "$D/t.0" ;;
    nodes) # no network transport: ucp does not call MPI (cmd/ucp/launch_test.go)
      tm "$D/t.0" env OMPI_MCA_btl=self OMPI_MCA_plm=isolated OMPI_MCA_rmaps_base_oversubscribe=1 \
        mpirun -n "$NODES" --oversubscribe --allow-run-as-root sh -c \
        '/usr/bin/time -f "%e %U %S %M" -o "$1.$OMPI_COMM_WORLD_RANK" "$2" convert --quiet --memory "$3" --workers 1 "$4" "$5"' \
        sh "$D/t.n" "$UCP" "$MEM" "$src" "$D/out" > /dev/null
      jq -S '{params, files}' "$D/out/ucp.json" | cmp - "$D/manifest.$l" ||
        { echo "scale: $NODES nodes' manifest differs from one node's" >&2; exit 1; }
      record "$l" "$bytes" "$run" "$load" "$D/t.0" "$D"/t.n.* ;;
    esac
  done
  clean
}

for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then runs "$SMALL"; runs "$BIG"; else runs "$BIG"; runs "$SMALL"; fi
done

# Best wall of each run and size; the big/small ratios of bytes, wall, CPU
# and RSS, and each run against the floor.
echo
awk -F'\t' -v s="$SMALL" -v b="$BIG" 'NR > 1 && ($2 == s || $2 == b) {
    k = $2 " " $4; by[$2] = $3
    if (!(k in w) || $5 < w[k]) { w[k] = $5; c[k] = $6 + $7; ld[k] = $9 }
    if ($8 > m[k]) m[k] = $8 }
  END {
    printf "%-6s %9s %-6s %8s %8s %8s %9s %6s\n", "layers", "GB", "run", "wall", "CPU", "x floor", "RSS MB", "load"
    split("floor one nodes", R, " ")
    for (i = 1; i <= 3; i++) for (j = 0; j < 2; j++) { l = j ? b : s; k = l " " R[i]; if (!(k in w)) continue
      printf "%-6s %9.2f %-6s %8.2f %8.2f %8.2f %9.0f %6s\n", l, by[l] / 1e9, R[i], w[k], c[k], w[k] / w[l " floor"], m[k] / 1024, ld[k] }
    if (by[s] && by[b]) {
      printf "big/small: %.2fx bytes\n", by[b] / by[s]
      for (i = 1; i <= 3; i++) printf "  %-6s %.2fx wall, %.2fx CPU, %.2fx peak RSS\n", R[i],
        w[b " " R[i]] / w[s " " R[i]], c[b " " R[i]] / c[s " " R[i]], m[b " " R[i]] / m[s " " R[i]]
    } }' "$RES"
