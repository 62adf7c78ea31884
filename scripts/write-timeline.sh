#!/usr/bin/env bash
# write-timeline.sh DIR CMD...: runs CMD and prints what the block device
# holding DIR wrote, in GB/s per 0.1 s, from the kernel's own counters
# (/sys/class/block/DEV/stat, sectors written). It shows where a synced
# command's time goes: the device accepting writes, then the fsync's cache
# flush, when the device reports nothing written yet the command waits
# (README, "What bounds a synced writer").
#   scripts/write-timeline.sh /data sh -c 'cp -r ckpt copy && sync'
#   scripts/write-timeline.sh /data bin/ucp export --to dcp atomic out
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: write-timeline.sh DIR CMD..." >&2; exit 2; }
dir=$1; shift
src=$(df --output=source "$dir" | tail -1)
dev=$(basename "$(readlink -f "$src")")
stat=/sys/class/block/$dev/stat
[ -r "$stat" ] || { echo "write-timeline.sh: no block statistics for $src ($stat)" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
sample() { while :; do echo "${EPOCHREALTIME} $(awk '{print $7}' "$stat")"; sleep 0.1; done; }
sample > "$log" &
sampler=$!
start=${EPOCHREALTIME}
rc=0
"$@" || rc=$?
end=${EPOCHREALTIME}
sleep 0.2
kill "$sampler"
wait "$sampler" 2>/dev/null || true
awk -v s="$start" -v e="$end" -v rc="$rc" '
  { t[NR] = $1; w[NR] = $2 }
  END {
    printf "wall %.2f s, exit %d; GB/s written by time since start:\n", e - s, rc
    for (i = 2; i <= NR; i++) {
      if (t[i] < s || t[i-1] > e) continue
      gbs = (w[i] - w[i-1]) * 512 / 1e9 / (t[i] - t[i-1])
      total += (w[i] - w[i-1]) * 512
      printf " %4.1f:%4.1f", t[i] - s, gbs
      if (++n % 10 == 0) printf "\n"
    }
    printf "\n%.2f GB written\n", total / 1e9
  }' "$log"
exit "$rc"
