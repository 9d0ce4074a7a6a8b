#!/usr/bin/env bash
# Serve gpulab: the hub, which starts its proxy (configurable-http-proxy) and the gpulab
# service it manages, from what scripts/install.sh (or `make setup`) put in place. It installs
# nothing and checks no image: it only finds the hub and the proxy, or says to install, then
# runs the hub in the foreground (its log on stdout and stderr: the journal under systemd).
# The systemd unit (deploy/systemd/gpulab.service) runs this, and so do `make serve` and
# `make run` (after its set-up).
#
# Usage: scripts/serve.sh [JUPYTERHUB_ARGS...]
# Environment:
#   GPULAB_CONFIG_FILE  the hub's configuration file (default <checkout>/jupyterhub_config.py,
#                       which reads the site file: GPULAB_SITE_CONFIG, else
#                       /etc/gpulab/gpulab_config.py)
#   GPULAB_VENV         the virtual environment (default <checkout>/.venv)
#   GPULAB_NODE_DIR     where configurable-http-proxy is installed (default <checkout>/.build/node)
#   and what jupyterhub_config.py reads: GPULAB_DATA_DIR, GPULAB_PORT, ... (docs/configuration.md)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${GPULAB_VENV:-$ROOT/.venv}
NODE_DIR=${GPULAB_NODE_DIR:-$ROOT/.build/node}
CONFIG=${GPULAB_CONFIG_FILE:-$ROOT/jupyterhub_config.py}

die() { echo "[serve] ERROR: $*" >&2; exit 1; }
[ -x "$VENV/bin/jupyterhub" ] || die "no $VENV/bin/jupyterhub: gpulab is not installed; run scripts/install.sh (as root) first"
[ -x "$NODE_DIR/node_modules/.bin/configurable-http-proxy" ] \
    || die "no configurable-http-proxy in $NODE_DIR: run scripts/install.sh (as root) first"
command -v node >/dev/null 2>&1 || die "node is not on the PATH ($PATH): run scripts/install-prereqs.sh"
[ -f "$CONFIG" ] || die "no configuration file $CONFIG"

export PATH="$NODE_DIR/node_modules/.bin:$VENV/bin:$PATH"
exec "$VENV/bin/jupyterhub" -f "$CONFIG" "$@"
