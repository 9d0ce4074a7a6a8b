#!/usr/bin/env bash
# The system packages a gpulab server needs, from the distribution's own archive, on Debian 12
# (bookworm) or Ubuntu 24.04 (noble); run as root before scripts/install.sh. A minimal install
# of either lacks most of them (make, git, python3-venv, pip, Node.js, Docker):
#   git make ca-certificates procps   the checkout, the Makefile, ensure-docker.sh's pgrep
#   python3 python3-venv python3-pip  gpulab's virtual environment (3.11 or newer); the image
#                                     build downloads the images' wheels with python3 -m pip
#   nodejs npm                        configurable-http-proxy, the hub's proxy (installed by
#                                     scripts/install.sh from npm into .build/node). Debian 12's
#                                     and Ubuntu 24.04's Node.js is 18: install.sh then takes
#                                     configurable-http-proxy 5.1, the last 5.x that declares
#                                     Node.js 18 (from 5.2 it declares 20). A node (18 or newer)
#                                     already on the PATH, e.g. NodeSource's, is kept.
#   docker.io apparmor                the Docker engine (kept when a docker and dockerd are
#                                     already installed, e.g. Docker's docker-ce), and the
#                                     AppArmor tools it loads its profile with (a recommendation
#                                     of docker.io's; the others are not installed)
#   debootstrap, and g++ make         the image build: the images' Debian base, and the native
#   pkg-config libkrb5-dev            modules of code-server (VS Code), compiled on the host
#   libx11-dev libxkbfile-dev         (scripts/build-code-server.sh)
#   libsecret-1-dev
# Idempotent: it installs only what is missing and says what it installed, or that nothing
# was missing; then it checks the versions gpulab needs (python3 >= 3.11, node >= 18).
#
# Usage: scripts/install-prereqs.sh [--check]   (--check: say what is missing, install nothing;
#                                                 exit 1 when something is)
set -euo pipefail

log() { echo "[install-prereqs] $*"; }
die() { echo "[install-prereqs] ERROR: $*" >&2; exit 1; }

CHECK=0
case "${1:-}" in
    --check) CHECK=1 ;;
    "") ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
esac

PACKAGES=(git make ca-certificates procps python3 python3-venv python3-pip debootstrap
    g++ pkg-config libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev)
# Node.js and Docker: the distribution's, unless the commands are there already
node_major() { node --version 2>/dev/null | sed -n 's/^v\([0-9]*\)\..*/\1/p'; }
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    PACKAGES+=(nodejs npm)
fi
if ! command -v docker >/dev/null 2>&1 || ! command -v dockerd >/dev/null 2>&1; then
    PACKAGES+=(docker.io apparmor)
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing=()
for p in "${PACKAGES[@]}"; do
    installed "$p" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
    log "nothing to install: every prerequisite is present"
elif [ "$CHECK" = 1 ]; then
    log "missing: ${missing[*]}"
    exit 1
else
    [ "$(id -u)" = 0 ] || die "missing ${missing[*]}; installing them needs root (sudo $0)"
    command -v apt-get >/dev/null 2>&1 || die "no apt-get: this script knows Debian and Ubuntu only; install ${missing[*]} yourself"
    log "installing ${missing[*]} (apt-get) ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
    log "installed ${missing[*]}"
fi

# the versions gpulab needs
py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "python3 is $py; gpulab needs 3.11 or newer (Debian 12, Ubuntu 24.04)"
python3 -c 'import ensurepip, venv' 2>/dev/null || die "python3 cannot make a virtual environment (apt-get install python3-venv)"
major=$(node_major)
[ -n "$major" ] && [ "$major" -ge 18 ] \
    || die "node is $(node --version 2>/dev/null || echo missing); configurable-http-proxy 5 needs Node.js 18 or newer"
log "python3 $py, node $(node --version), npm $(npm --version), $(docker --version 2>/dev/null || echo 'docker: missing')"
