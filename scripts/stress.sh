#!/usr/bin/env bash
# Long variant of the fault suite (tests/faults/): >= 50 SIGKILL trials with concurrent writers and a
# held-back write, 1,000 injected faults across data and metadata files, a 64 MiB tmpfs filled to the
# top. Needs root (mount -t tmpfs). Prints the figures at the end and writes them to
# ${LIFEBOAT_FIGURES_OUT:-$TMPDIR/lifeboat-stress-figures.json}.
#   scripts/stress.sh [pytest args...]
# Builds/refreshes .venv first (scripts/_venv.sh), like scripts/test.sh.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
# shellcheck source=scripts/_venv.sh
source "$root/scripts/_venv.sh" || exit 1

export LIFEBOAT_STRESS=1
export LIFEBOAT_FIGURES_OUT="${LIFEBOAT_FIGURES_OUT:-${TMPDIR:-/tmp}/lifeboat-stress-figures.json}"
python -m pytest tests/faults -q "$@"
rc=$?
if [[ $rc -eq 5 ]]; then
    echo "scripts/stress.sh: pytest collected no tests (exit 5): treating as failure" >&2
    exit 1
fi
exit "$rc"
