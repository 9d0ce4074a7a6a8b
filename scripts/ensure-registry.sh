#!/usr/bin/env bash
# Debian's docker-registry (distribution 2.8) for the tests of images pulled from a private
# registry (tests/integration/test_jobs.py starts one of its own, with TLS from a test CA and
# htpasswd users) and the swarm lab's registry. Installed if missing (idempotent, fast when
# present); the package's own service is not started.
set -euo pipefail
log() { printf '[ensure-registry] %s\n' "$*" >&2; }

if command -v docker-registry >/dev/null 2>&1; then
    exit 0
fi
log "installing Debian's docker-registry"
"$(dirname "$0")/apt-install.sh" --no-start --log /tmp/gpulab-apt-registry.log docker-registry
command -v docker-registry >/dev/null 2>&1 || { log "ERROR: docker-registry is still missing"; exit 1; }
