#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine: exit 0 at once when `docker info` works;
# otherwise start an installed dockerd in the background (this machine has no systemd), or
# install Debian's docker.io first and then start it. Idempotent and safe to run concurrently.
#
# Environment:
#   DOCKERD_LOG        where a started dockerd logs (default /var/log/dockerd.log)
#   DOCKER_WAIT        seconds to wait for the engine to answer (default 60)
set -euo pipefail

DOCKERD_LOG=${DOCKERD_LOG:-/var/log/dockerd.log}
DOCKER_WAIT=${DOCKER_WAIT:-60}
LOCK=${GPULAB_DOCKER_LOCK:-/tmp/gpulab-ensure-docker.lock}

log() { echo "[ensure-docker] $*" >&2; }
die() { echo "[ensure-docker] ERROR: $*" >&2; exit 1; }

engine_up() { command -v docker >/dev/null 2>&1 && timeout 15 docker info >/dev/null 2>&1; }

# Fast path: nothing to do.
if engine_up; then
    exit 0
fi

# A remote engine is not ours to start.
case "${DOCKER_HOST:-}" in
    "" | unix:///var/run/docker.sock | unix:///run/docker.sock) ;;
    *) die "DOCKER_HOST=$DOCKER_HOST does not answer 'docker info'; start that engine yourself." ;;
esac

[ "$(id -u)" = 0 ] || die "no Docker engine answers and starting/installing one needs root (run as root, or start dockerd yourself)."

# One starter at a time: a second caller waits here, then finds the engine up.
exec 9>"$LOCK"
flock -w 600 9 || die "timed out waiting for the lock $LOCK"
if engine_up; then
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
    log "dockerd not installed: installing Debian's docker.io (apt-get) ..."
    t0=$SECONDS
    "$(dirname "$0")/apt-install.sh" --log /tmp/gpulab-apt-docker.log docker.io
    command -v dockerd >/dev/null 2>&1 || die "docker.io installed but dockerd is not on PATH"
    log "installed docker.io in $((SECONDS - t0)) s"
fi
command -v docker >/dev/null 2>&1 || die "dockerd is installed but the docker client is missing (apt-get install docker.io)"

if pgrep -x dockerd >/dev/null 2>&1; then
    log "a dockerd is already running (pid $(pgrep -x dockerd | tr '\n' ' ')); waiting for it to answer ..."
else
    log "starting dockerd in the background (log: $DOCKERD_LOG) ..."
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    # setsid + nohup: the engine must outlive make and this shell's session.
    setsid nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
fi

t0=$SECONDS
while ! engine_up; do
    if (( SECONDS - t0 >= DOCKER_WAIT )); then
        if [ -f "$DOCKERD_LOG" ]; then
            log "last lines of $DOCKERD_LOG:"
            tail -n 30 "$DOCKERD_LOG" >&2
        fi
        pgrep -x dockerd >/dev/null 2>&1 || log "dockerd is not running any more"
        die "the Docker engine did not answer 'docker info' within ${DOCKER_WAIT} s"
    fi
    sleep 1
done
log "Docker engine up after $((SECONDS - t0)) s: server $(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?')"
