#!/usr/bin/env bash
# Long, seeded failure-story runs (left out of scripts/test.sh): scripts/stress.sh [pytest args...]
#  1. the fault suite (tests/faults/) at full size: >= 50 SIGKILL trials with concurrent writers and a
#     held-back write, 1,000 injected faults across data and metadata files, a 64 MiB tmpfs filled to
#     the top. Needs root (mount -t tmpfs). Prints the figures at the end and writes them to
#     ${LIFEBOAT_FIGURES_OUT:-$TMPDIR/lifeboat-stress-figures.json}.
#  2. every test marked `stress` (long tier hangs, S3 rebuild at scale).
# Builds/refreshes .venv first (scripts/_venv.sh), like scripts/test.sh.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
# shellcheck source=scripts/_venv.sh
source "$root/scripts/_venv.sh" || exit 1

export LIFEBOAT_STRESS=1
export LIFEBOAT_FIGURES_OUT="${LIFEBOAT_FIGURES_OUT:-${TMPDIR:-/tmp}/lifeboat-stress-figures.json}"
python -m pytest -m "not slow or slow" tests/faults -q "$@"
rc1=$?
python -m pytest -m stress -q "$@"
rc2=$?
for rc in $rc1 $rc2; do
    if [[ $rc -eq 5 ]]; then
        echo "scripts/stress.sh: pytest collected no tests (exit 5): treating as failure" >&2
        exit 1
    fi
done
exit $(( rc1 != 0 ? rc1 : rc2 ))
