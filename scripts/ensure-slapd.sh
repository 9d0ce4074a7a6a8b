#!/usr/bin/env bash
# OpenLDAP's server and tools for the log-in tests (tests/integration/test_login.py), which
# start a throwaway slapd of their own on a free port: Debian's slapd and ldap-utils are
# installed if missing (idempotent, fast when present). No directory server is started here,
# and the package's own (an empty example directory) is left stopped.
set -euo pipefail
log() { printf '[ensure-slapd] %s\n' "$*" >&2; }

if [ -x /usr/sbin/slapd ] && command -v ldapadd >/dev/null 2>&1 && command -v slappasswd >/dev/null 2>&1; then
    exit 0
fi
log "installing Debian's slapd and ldap-utils"
# no questions, and no server started by the package's scripts (the tests start their own)
RUNLEVEL=1 "$(dirname "$0")/apt-install.sh" --no-start --log /tmp/gpulab-apt-slapd.log \
    --debconf "slapd slapd/no_configuration boolean true" slapd ldap-utils
test -x /usr/sbin/slapd || { log "ERROR: /usr/sbin/slapd is still missing"; exit 1; }
log "$(/usr/sbin/slapd -VV 2>&1 | head -n 1)"
