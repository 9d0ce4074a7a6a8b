#!/usr/bin/env bash
# Install gpulab on a server, from this checkout: the one command after the prerequisites
# (scripts/install-prereqs.sh). It puts in place, each only when it is not there already:
#   venv    gpulab and its dependencies in a virtual environment (.venv; editable, so that the
#           checkout is the installation), byte-compiled (the unit runs it on a read-only /opt)
#   proxy   configurable-http-proxy 5 from npm, in .build/node: the newest 5.x on Node.js 20 or
#           later, 5.1 on Node.js 18 (Debian 12's, Ubuntu 24.04's), the last that declares it
#           (npm itself would take the newest and only warn)
#   engine  a Docker engine that answers (systemd: systemctl enable --now docker; a machine
#           without systemd: scripts/ensure-docker.sh starts dockerd)
#   images  the notebook and sync images, built when missing or stale (scripts/build-images.sh;
#           the first build takes a while and downloads the frameworks' wheels)
# and says, step by step, what it did; a second run finds everything in place and says
# "nothing to do". It installs no system package (apt-get is the prerequisites' step) and
# starts nothing of gpulab's: serving is scripts/serve.sh, which the systemd unit
# deploy/systemd/gpulab.service runs (docs/install.md).
#
# Usage: scripts/install.sh [--gpu auto|cuda|cpu] [--force-images]
#   --gpu           the framework images' flavour (default auto: CUDA where an NVIDIA driver is)
#   --force-images  rebuild the images even when they are up to date
# Environment:
#   GPULAB_VENV      the virtual environment (default <checkout>/.venv)
#   GPULAB_NODE_DIR  where configurable-http-proxy is installed (default <checkout>/.build/node)
#   CHP_VERSION      configurable-http-proxy's npm version range (default: 5, on Node.js 18 ~5.1)
#   PYTHON           the interpreter the venv is made from (default python3)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${GPULAB_VENV:-$ROOT/.venv}
NODE_DIR=${GPULAB_NODE_DIR:-$ROOT/.build/node}
PYTHON=${PYTHON:-python3}
LOGS=$ROOT/.build/logs
CHP=$NODE_DIR/node_modules/.bin/configurable-http-proxy

GPU=
FORCE_IMAGES=
while [ $# -gt 0 ]; do
    case "$1" in
        --gpu) GPU=${2:?--gpu needs auto, cuda or cpu}; shift ;;
        --gpu=*) GPU=${1#--gpu=} ;;
        --force-images) FORCE_IMAGES=--force ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
    shift
done

T_START=$SECONDS
DID=()
say() { printf '[install] %-7s %s\n' "$1" "$2"; }
did() { DID+=("$1"); say "$1" "$2"; }
die() { printf '[install] ERROR: %s\n' "$*" >&2; exit 1; }
mkdir -p "$LOGS"

# --- what the prerequisites provide ------------------------------------------------------------
need=()
"$PYTHON" -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || need+=("$PYTHON 3.11+ with venv")
command -v node >/dev/null 2>&1 || need+=(node)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v docker >/dev/null 2>&1 || need+=(docker)
[ ${#need[@]} -eq 0 ] || die "missing ${need[*]}: run scripts/install-prereqs.sh (as root) first"

# --- venv: gpulab and its dependencies ---------------------------------------------------------
# in place when the stamp names this checkout, this pyproject.toml and this interpreter, and
# the venv imports gpulab from this checkout (by itself: without the caller's PYTHONPATH)
unset PYTHONPATH
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$ROOT/src/gpulab/__init__.py")
stamp="gpulab $version from $ROOT; pyproject $(sha256sum "$ROOT/pyproject.toml" | cut -c1-16); $("$PYTHON" --version 2>&1)"
venv_ok() {
    [ -f "$VENV/.gpulab-install" ] && [ "$(cat "$VENV/.gpulab-install")" = "$stamp" ] \
        && [ -x "$VENV/bin/jupyterhub" ] \
        && [ "$("$VENV/bin/python" -c 'import gpulab, jupyterhub; print(gpulab.__file__)' 2>/dev/null)" = "$ROOT/src/gpulab/__init__.py" ]
}
if venv_ok; then
    # the checkout's code may have changed (an upgrade): byte-compile what is new, quietly
    "$VENV/bin/python" -m compileall -q "$ROOT/src" >/dev/null 2>&1 || true
    say venv "in place: gpulab $version in $VENV"
else
    t0=$SECONDS
    : >"$LOGS/install-venv.log"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" >>"$LOGS/install-venv.log" 2>&1 \
        || { tail -n 20 "$LOGS/install-venv.log" >&2; die "$PYTHON -m venv $VENV failed"; }
    "$VENV/bin/pip" install --disable-pip-version-check --progress-bar off -e "$ROOT" \
        >>"$LOGS/install-venv.log" 2>&1 \
        || { grep -v 'is ignored' "$LOGS/install-venv.log" | tail -n 30 >&2; die "pip install -e $ROOT failed (log: $LOGS/install-venv.log)"; }
    "$VENV/bin/python" -m compileall -q "$ROOT/src" >>"$LOGS/install-venv.log" 2>&1 || true
    echo "$stamp" >"$VENV/.gpulab-install"
    venv_ok || die "gpulab does not import from $ROOT in $VENV after pip install (log: $LOGS/install-venv.log)"
    did venv "installed gpulab $version and its dependencies into $VENV ($((SECONDS - t0)) s)"
fi

# --- proxy: configurable-http-proxy ------------------------------------------------------------
node_major=$(node --version | sed -n 's/^v\([0-9]*\)\..*/\1/p')
if [ -z "${CHP_VERSION:-}" ]; then
    if [ "${node_major:-0}" -ge 20 ]; then CHP_VERSION=5; else CHP_VERSION="~5.1"; fi
fi
# chp_engine_ok: the installed configurable-http-proxy declares this Node.js (its engines.node
# is ">= N")
chp_engine_ok() {
    local want
    want=$(node -e 'console.log((require(process.argv[1]).engines || {}).node || "")' \
        "$NODE_DIR/node_modules/configurable-http-proxy/package.json" 2>/dev/null | sed -n 's/^>= *\([0-9]*\).*/\1/p')
    [ -z "$want" ] || [ "${node_major:-0}" -ge "$want" ]
}
if [ -x "$CHP" ] && chp_version=$("$CHP" --version 2>/dev/null) && chp_engine_ok; then
    say proxy "in place: configurable-http-proxy $chp_version in $NODE_DIR (node $(node --version))"
else
    t0=$SECONDS
    mkdir -p "$NODE_DIR"
    npm install --prefix "$NODE_DIR" --no-audit --no-fund --loglevel=error \
        "configurable-http-proxy@$CHP_VERSION" >"$LOGS/install-proxy.log" 2>&1 \
        || { tail -n 20 "$LOGS/install-proxy.log" >&2; die "npm install configurable-http-proxy@$CHP_VERSION failed"; }
    chp_version=$("$CHP" --version 2>/dev/null) || die "npm install did not give a working $CHP"
    chp_engine_ok || die "configurable-http-proxy $chp_version does not declare node $(node --version) (CHP_VERSION=$CHP_VERSION)"
    did proxy "installed configurable-http-proxy $chp_version into $NODE_DIR for node $(node --version) ($((SECONDS - t0)) s)"
fi

# --- engine: a Docker engine that answers ------------------------------------------------------
engine_up() { timeout 15 docker info >/dev/null 2>&1; }
if engine_up; then
    say engine "in place: Docker $(docker version --format '{{.Server.Version}}' 2>/dev/null) answers"
else
    if [ -d /run/systemd/system ] && [ -z "${DOCKER_HOST:-}" ]; then
        systemctl enable --now docker.service || die "systemctl enable --now docker.service failed"
    else
        "$ROOT/scripts/ensure-docker.sh"
    fi
    for _ in $(seq 60); do engine_up && break; sleep 1; done
    engine_up || die "the Docker engine does not answer docker info"
    did engine "started the Docker engine ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
fi

# --- images: built when missing or stale -------------------------------------------------------
build_args=()
[ -z "$GPU" ] || build_args+=(--gpu "$GPU")
[ -z "$FORCE_IMAGES" ] || build_args+=("$FORCE_IMAGES")
t0=$SECONDS
"$ROOT/scripts/build-images.sh" "${build_args[@]}" 2>"$LOGS/install-images.log" \
    || { tail -n 30 "$LOGS/install-images.log" >&2; die "scripts/build-images.sh failed (log: $LOGS/install-images.log)"; }
# what it built, in its own words ("built TAG in N s"; an image up to date is "up to date")
changed=$(sed -n 's/^\[build-images *[0-9]*s\] built \([^ ]*\) in .*/\1/p' "$LOGS/install-images.log" | xargs)
if [ -z "$changed" ]; then
    say images "in place: $(sed -n 's/.*done: //p' "$LOGS/install-images.log" | xargs) (none missing or stale)"
else
    did images "built $changed ($((SECONDS - t0)) s; log: $LOGS/install-images.log)"
fi

# --- what happened ------------------------------------------------------------------------------
if [ ${#DID[@]} -eq 0 ]; then
    say done "nothing to do: gpulab, its proxy, the engine and the images were in place ($((SECONDS - T_START)) s)"
else
    say done "installed: ${DID[*]} ($((SECONDS - T_START)) s)"
fi
say next "serve: scripts/serve.sh, or the systemd unit deploy/systemd/gpulab.service (docs/install.md)"
