#!/usr/bin/env bash
# Regenerates testdata/fixtures/megatron_dist with real megatron-core writing torch_dist
# checkpoints on CPU, inside the torch 2.6 chroot of scripts/torch2-chroot.sh (which also
# installs the Python packages megatron-core imports: einops, yaml, packaging).
#
#   scripts/megatron-fixtures.sh MEGATRON_SRC [CASE ...]
#
# MEGATRON_SRC is a checkout (or `git archive`) of a Megatron-LM release tag holding the
# megatron/ package, e.g. core_v0.19.0, core_v0.18.2, core_v0.15.3 or core_v0.14.0 (the *_fsms cases). Cases are named
# core<major>_<minor>_<case>; rerunning replaces those of the same version. Not run by CI.
set -euo pipefail
src=${1:?usage: $0 MEGATRON_SRC [CASE ...]}; shift
[ -d "$src/megatron/core" ] || { echo "megatron-fixtures: $src has no megatron/core" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /var/tmp/ucp-megatron-fixtures.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/out"
cp -r "$src/megatron" "$work/src/"
cp "$here/testdata/gen/megatron_dist_fixtures.py" "$here/testdata/gen/megatron_dist_verify.py" "$work/"
"$here/scripts/torch2-chroot.sh" run "$work" python3 megatron_dist_fixtures.py src out "$@"
# Megatron itself loads each checkpoint back at TP 1 / PP 1 and must give the truth's weights.
for d in "$work"/out/*/; do
  name=$(basename "$d")
  "$here/scripts/torch2-chroot.sh" run "$work" python3 megatron_dist_verify.py src "out/$name" "$(echo "$name" | sed 's/^core[0-9]*_[0-9]*_//')"
done
dst=$here/testdata/fixtures/megatron_dist
mkdir -p "$dst"
for d in "$work"/out/*/; do
  name=$(basename "$d")
  rm -rf "${dst:?}/$name"
  cp -r "$d" "$dst/$name"
  echo "megatron-fixtures: $dst/$name"
done
