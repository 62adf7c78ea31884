#!/usr/bin/env bash
# same-output.sh [BASE [HEAD]]: converts every committed fixture (testdata/fixtures/*/*/checkpoint) with the ucp
# built from git revision BASE (default: main) and with the ucp built from revision HEAD (default: the working
# tree; the fixtures are always the working tree's), then compares
# the output trees byte for byte (every file, ucp.json included, and the list of folders). Each fixture is
# converted by one process and by two nodes (--num-nodes 2, small chunks so that files are shared between
# nodes and finished by the finalizer); each single-process result is exported to dcp (2 shards), torch
# and hf (the random save_id of DCP's .metadata is masked). Failing commands must fail the same way (exit status and message). Both binaries are built with
# -buildvcs=false so the manifest's tool string is the same. Exit 0 when everything is identical.
set -euo pipefail
base=${1:-main}
head=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/ucp-same-output.XXXXXX)
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/src-base" "$work/base" "$work/head"
git -C "$root" archive "$base" | tar -x -C "$work/src-base"
(cd "$work/src-base" && go build -buildvcs=false -o "$work/ucp-base" ./cmd/ucp)
if [ -n "$head" ]; then
	mkdir -p "$work/src-head"
	git -C "$root" archive "$head" | tar -x -C "$work/src-head"
	(cd "$work/src-head" && go build -buildvcs=false -o "$work/ucp-head" ./cmd/ucp)
else
	(cd "$root" && go build -buildvcs=false -o "$work/ucp-head" ./cmd/ucp)
fi

# run SIDE NAME ARGS...: runs one side's binary in its own folder (same relative paths on both sides)
# and keeps its exit status and stderr, with durations masked.
run() {
	local side=$1 name=$2
	shift 2
	local rc=0
	(cd "$work/$side" && "$work/ucp-$side" "$@" >/dev/null 2>"$work/$side/$name.err") || rc=$?
	sed -i -E 's/[0-9.]+ ?(ms|s|µs)\b/T/g' "$work/$side/$name.err"
	echo "$rc" >"$work/$side/$name.rc"
}

n=0
for src in "$root"/testdata/fixtures/*/*/checkpoint; do
	c=$(basename "$(dirname "$(dirname "$src")")")_$(basename "$(dirname "$src")")
	n=$((n + 1))
	for side in base head; do
		run $side "$c.convert" convert --quiet --no-sync --workers 2 "$src" "out/$c/atomic"
		run $side "$c.node0" convert --quiet --no-sync --workers 2 --chunk-elems 64 --num-nodes 2 --node-rank 0 "$src" "out/$c/nodes"
		run $side "$c.node1" convert --quiet --no-sync --workers 2 --chunk-elems 64 --num-nodes 2 --node-rank 1 "$src" "out/$c/nodes"
		run $side "$c.dcp" export --quiet --workers 2 "out/$c/atomic" "out/$c/dcp" --to dcp --shards 2
		run $side "$c.torch" export --quiet "out/$c/atomic" "out/$c/torch" --to torch
		run $side "$c.hf" export --quiet "out/$c/atomic" "out/$c/hf" --to hf
	done
done

# A DCP export's .metadata carries a random save_id (a UUID, as torch writes it): mask it on both sides.
find "$work/base/out" "$work/head/out" -name .metadata -path '*/dcp/*' -exec \
	perl -0777 -pi -e 's/(save_idX\$\x00\x00\x00)[0-9a-f-]{36}/$1 . ("0" x 36)/ge' {} +

fail=0
if ! diff -r "$work/base" "$work/head"; then
	fail=1
fi
if ! diff <(cd "$work/base" && find . -type d | sort) <(cd "$work/head" && find . -type d | sort); then
	fail=1
fi
files=$(cd "$work/head" && find out -type f | wc -l)
bad=$(cat "$work"/head/*.rc | grep -vc '^0$' || true)
echo "$n fixtures, $files output files compared ($bad commands failed, the same way on both sides)"
if [ $fail -ne 0 ]; then
	echo "DIFFERENT: the output of $base and of ${head:-the working tree} differ"
	exit 1
fi
echo "IDENTICAL: the output of $base and of ${head:-the working tree} are byte for byte the same"
