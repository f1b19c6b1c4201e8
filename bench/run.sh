#!/usr/bin/env bash
# Runs every benchmark (bench/<name>/run.sh BUILD_DIR), or the ones named: bench/run.sh BUILD [NAME...]
set -euo pipefail
BUILD=$(realpath "${1:-build/release}")
shift || true
cd "$(dirname "$0")"
names=("$@")
[ ${#names[@]} -eq 0 ] && names=($(for d in */run.sh; do dirname "$d"; done))
for n in "${names[@]}"; do
  echo "=== bench/$n ==="
  bash "$n/run.sh" "$BUILD"
done
