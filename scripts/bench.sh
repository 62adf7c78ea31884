#!/usr/bin/env bash
# make bench: ucp convert against the I/O floor on a large generated
# DeepSpeed checkpoint (GPT-like, ZeRO-2, bf16, TP 2 x DP 4, ~4.3 GB).
# Everything is measured in this one run, page cache warm, and printed as
# ratios to `cp -r` of the same folder.
#
#   BENCH_DIR=.bench        where the checkpoints go (needs ~15 GB free)
#   BENCH_LAYERS=4          transformer layers of the generated model
#   BENCH_MEMORY=1GiB       ucp's --memory budget
#   BENCH_DOUBLE=1          also convert a checkpoint with twice the layers (peak RSS must stay flat)
#   BENCH_REPEAT=3          runs of each measurement; the fastest counts (the machine may be shared)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BENCH_DIR:-.bench}
LAYERS=${BENCH_LAYERS:-4}
MEM=${BENCH_MEMORY:-1GiB}
UCP=bin/ucp
CORES=$(nproc)
mkdir -p "$B" bin
go build -o "$UCP" ./cmd/ucp
go build -o bin/benchgen ./internal/cmd/benchgen

REPEAT=${BENCH_REPEAT:-3}
now() { echo "${EPOCHREALTIME}"; }
# best CMD...: the fastest of REPEAT runs of a command, in seconds.
best() {
  local b="" t0 t1 s
  for _ in $(seq "$REPEAT"); do
    t0=$(now); "$@" >/dev/null; t1=$(now)
    s=$(secs "$t0" "$t1")
    if [ -z "$b" ] || awk -v a="$s" -v b="$b" 'BEGIN{exit !(a < b)}'; then b=$s; fi
  done
  echo "$b"
}
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
gen() { # gen DIR LAYERS
  if [ ! -f "$1/latest" ]; then
    rm -rf "$1"
    bin/benchgen --out "$1" --layers "$2"
  fi
}
warm() { cat "$1"/*/* > /dev/null; }
json() { # json FILE KEY: a top-level number from a report
  grep -o "\"$2\": [0-9.e+]*" "$1" | head -1 | awk '{print $2}'
}

gen "$B/src" "$LAYERS"
SRC_BYTES=$(du -sb "$B/src" | cut -f1)
warm "$B/src"
echo "source: $B/src, $(awk -v b="$SRC_BYTES" 'BEGIN{printf "%.2f GB", b/1e9}'), $CORES cores, --memory $MEM"

copy() { rm -rf "$B/cp"; sync; cp -r "$B/src" "$B/cp"; }
copysync() { rm -rf "$B/cp"; sync; cp -r "$B/src" "$B/cp"; sync; }
T_CP=$(best copy)
T_CPS=$(best copysync)
rm -rf "$B/cp"

run1() { # run1 NAME ARGS...: one conversion into $B/NAME
  local name=$1; shift
  rm -rf "$B/$name" "$B/$name.partial"; sync
  "$UCP" convert --quiet --force --memory "$MEM" "$@" "$B/src" "$B/$name"
}
convert() { best run1 "$@"; }
T_U1=$(convert out1 --workers 1 --no-sync --report "$B/report-1.json")
RSS1=$(json "$B/report-1.json" peak_rss_bytes)
rm -rf "$B/out1"
T_UN=$(convert outn --workers "$CORES" --no-sync --report "$B/report-n.json")
RSSN=$(json "$B/report-n.json" peak_rss_bytes)
T_UNS=$(convert outs --workers "$CORES" --report "$B/report-s.json")
# ucp export --to hf (bf16, synced) against cp -r; sync of the same output bytes.
exphf() { rm -rf "$B/hf"; sync; "$UCP" export --quiet --force --to hf --dtype bfloat16 --memory "$MEM" --verify=false "$B/outs" "$B/hf"; }
T_EX=$(best exphf)
cphf() { rm -rf "$B/hfcp"; sync; cp -r "$B/hf" "$B/hfcp"; sync; }
T_EXCP=$(best cphf)
HF_BYTES=$(du -sb "$B/hf" | cut -f1)
rm -rf "$B/outs" "$B/hf" "$B/hfcp"

# Four simulated nodes: four processes sharing one output folder.
rm -rf "$B/out4" "$B/out4.partial"; sync
t0=$(now)
for n in 0 1 2 3; do
  "$UCP" convert --quiet --memory "$MEM" --workers 1 --no-sync --num-nodes 4 --node-rank $n \
    --report "$B/report-node$n.json" "$B/src" "$B/out4" &
done
wait
t1=$(now); T_N4=$(secs "$t0" "$t1")
SAME=yes
(cd "$B/outn" && find . -type f ! -name ucp.json | sort) > "$B/files.txt"
while read -r f; do cmp -s "$B/outn/$f" "$B/out4/$f" || { SAME="no ($f differs)"; break; }; done < "$B/files.txt"
NODE_IO=()
for n in 0 1 2 3; do
  r=$(json "$B/report-node$n.json" bytes_read); w=$(json "$B/report-node$n.json" bytes_written)
  NODE_IO+=("$(awk -v r="$r" -v w="$w" 'BEGIN{printf "%.0f", r + w}')")
done
SPREAD=$(printf '%s\n' "${NODE_IO[@]}" | awk 'NR==1{lo=$1;hi=$1} {if($1<lo)lo=$1; if($1>hi)hi=$1} END{printf "%.1f", 100*(hi-lo)/lo}')
rm -rf "$B/outn" "$B/out4"

echo
printf '%-44s %8s %8s\n' "run" "seconds" "x cp -r"
printf '%-44s %8s %8s\n' "cp -r (the I/O floor)" "$T_CP" "1.00"
printf '%-44s %8s %8s\n' "cp -r; sync" "$T_CPS" "$(ratio "$T_CPS" "$T_CP")"
printf '%-44s %8s %8s\n' "ucp convert --workers 1 --no-sync" "$T_U1" "$(ratio "$T_U1" "$T_CP")"
printf '%-44s %8s %8s\n' "ucp convert --workers $CORES --no-sync" "$T_UN" "$(ratio "$T_UN" "$T_CP")"
printf '%-44s %8s %8s   (x cp -r; sync: %s)\n' "ucp convert --workers $CORES (synced)" "$T_UNS" "$(ratio "$T_UNS" "$T_CP")" "$(ratio "$T_UNS" "$T_CPS")"
printf '%-44s %8s %8s\n' "4 nodes x 1 worker (processes), --no-sync" "$T_N4" "$(ratio "$T_N4" "$T_CP")"
printf '%-44s %8s %8s   (x cp -r; sync of its %s: %s)\n' "ucp export --to hf --dtype bfloat16 (synced)" "$T_EX" "$(ratio "$T_EX" "$T_CP")" \
  "$(awk -v b="$HF_BYTES" 'BEGIN{printf "%.2f GB", b/1e9}')" "$(ratio "$T_EX" "$T_EXCP")"
echo
echo "peak RSS: $(awk -v a="$RSS1" 'BEGIN{printf "%.0f MB", a/1e6}') with 1 worker, $(awk -v a="$RSSN" 'BEGIN{printf "%.0f MB", a/1e6}') with $CORES (budget $MEM)"
echo "4 nodes: output identical to 1 node: $SAME; bytes moved per node ${NODE_IO[*]} (spread ${SPREAD}%)"
echo "target: ucp with all workers <= 2x cp -r: $(awk -v a="$T_UN" -v b="$T_CP" 'BEGIN{print (a <= 2*b) ? "met" : "missed"}')"

if [ "${BENCH_DOUBLE:-0}" = 1 ]; then
  gen "$B/src2" $((2 * LAYERS))
  warm "$B/src2"
  rm -rf "$B/out2"
  "$UCP" convert --quiet --memory "$MEM" --workers "$CORES" --no-sync --report "$B/report-2.json" "$B/src2" "$B/out2"
  rm -rf "$B/out2"
  RSS2=$(json "$B/report-2.json" peak_rss_bytes)
  echo "doubled checkpoint ($(du -sh "$B/src2" | cut -f1)): peak RSS $(awk -v a="$RSS2" 'BEGIN{printf "%.0f MB", a/1e6}') (was $(awk -v a="$RSSN" 'BEGIN{printf "%.0f MB", a/1e6}'))"
fi
