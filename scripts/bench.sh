#!/usr/bin/env bash
# Measure LifeboatCache on this machine in one run: scripts/bench.sh [--quick] [--out DIR] [--size KEY=VALUE ...]
# Builds/refreshes .venv first (scripts/_venv.sh), then runs `lifeboat bench`: prints the table and writes
# results.json, results.md and PNG plots into DIR (default bench-results/). See README "Performance".
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
# shellcheck source=scripts/_venv.sh
source "$root/scripts/_venv.sh" || exit 1

exec python -m lifeboat_cache.cli bench "$@"
