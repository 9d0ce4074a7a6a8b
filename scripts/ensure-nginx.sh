#!/usr/bin/env bash
# Debian's nginx for the tests of object stores behind TLS (tests/integration/test_store_tls.py),
# which start a throwaway nginx of their own, a TLS-terminating proxy in front of a moto server
# with a certificate from a CA the test makes, and the HTTPS front door's browser test
# (tests/browser/test_https.py), which renders the shipped site (deploy/nginx/gpulab.conf) in
# front of a hub the same way. nginx-light is installed if missing
# (idempotent, fast when present); the package's own server is stopped and left disabled.
set -euo pipefail
log() { printf '[ensure-nginx] %s\n' "$*" >&2; }

if [ -x /usr/sbin/nginx ]; then
    exit 0
fi
log "installing Debian's nginx-light"
# no server started by the package's scripts (the tests start their own)
"$(dirname "$0")/apt-install.sh" --no-start --log /tmp/gpulab-apt-nginx.log nginx-light
test -x /usr/sbin/nginx || { log "ERROR: /usr/sbin/nginx is still missing"; exit 1; }
log "$(/usr/sbin/nginx -v 2>&1)"
