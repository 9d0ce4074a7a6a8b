#!/usr/bin/env bash
# Install the Debian packages among PKG... that are missing, one apt-get at a time.
#
#   scripts/apt-install.sh [--no-start] [--debconf 'LINE'] [--log FILE] PKG...
#
# gpulab's set-up steps (make engine, images, browser, postgres, ldap, nginx) may run side by
# side (.ci/run does), and two apt-get runs at once fail: `apt-get update` does not wait for
# the package lists' lock, even with DPkg::Lock::Timeout. So every step installs through this
# script, which holds /var/lock/gpulab-apt.lock while it runs apt-get, and also waits for
# dpkg's own lock (an unattended upgrade, say). The package lists are refreshed once in an
# hour at most (a stamp), not by every step, and again when an install fails on stale lists.
#   --no-start       the packages' scripts start no service (a policy-rc.d while installing)
#   --debconf LINE   an answer for debconf-set-selections, given before installing
#   --log FILE       apt-get's output goes there (else to stderr); its tail is shown on failure
# Packages already installed make it exit 0 at once, without root.
set -euo pipefail
log() { printf '[apt-install] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

NO_START=0
DEBCONF=()
LOG=""
while [ $# -gt 0 ]; do
    case "$1" in
        --no-start) NO_START=1; shift ;;
        --debconf) DEBCONF+=("$2"); shift 2 ;;
        --log) LOG=$2; shift 2 ;;
        --) shift; break ;;
        -*) die "unknown option $1" ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || die "no package named"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing=()
for p in "$@"; do
    installed "$p" || missing+=("$p")
done
[ ${#missing[@]} -gt 0 ] || exit 0
[ "$(id -u)" = 0 ] || die "missing packages ${missing[*]}: installing them needs root (apt-get install ${missing[*]})"
command -v apt-get >/dev/null 2>&1 || die "no apt-get: install ${missing[*]} yourself"

exec 9>/var/lock/gpulab-apt.lock
flock -w 900 9 || die "timed out waiting for /var/lock/gpulab-apt.lock"
# another step may have installed them while this one waited
left=()
for p in "${missing[@]}"; do
    installed "$p" || left+=("$p")
done
[ ${#left[@]} -gt 0 ] || exit 0

out=${LOG:-/dev/stderr}
[ -n "$LOG" ] && : >"$LOG"
fail() {
    [ -n "$LOG" ] && tail -n 20 "$LOG" >&2
    die "$*"
}
export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -q -o DPkg::Lock::Timeout=300)
STAMP=/var/lib/apt/lists/.gpulab-updated
update() {
    "${APT[@]}" update >>"$out" 2>&1 || fail "apt-get update failed"
    touch "$STAMP"
}
[ -n "$(find "$STAMP" -mmin -60 2>/dev/null)" ] || update
for line in "${DEBCONF[@]}"; do
    echo "$line" | debconf-set-selections
done
if [ "$NO_START" = 1 ] && [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
log "installing ${left[*]} ..."
t0=$SECONDS
if ! "${APT[@]}" install -y "${left[@]}" >>"$out" 2>&1; then
    log "install failed; refreshing the package lists and trying once more"
    update
    "${APT[@]}" install -y "${left[@]}" >>"$out" 2>&1 || fail "apt-get install ${left[*]} failed"
fi
log "installed ${left[*]} in $((SECONDS - t0)) s"
