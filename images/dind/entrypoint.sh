#!/bin/sh
# Entry point of gpulab-lab/dind: forward ports onto loopback, then run dockerd in the
# foreground with the arguments given to the container (tini, PID 1, reaps the orphans).
#
# Environment:
#   LAB_FORWARD   space-separated LOCALPORT:HOST:PORT; each one runs
#                 `socat TCP-LISTEN:LOCALPORT,bind=127.0.0.1,fork,reuseaddr TCP:HOST:PORT`
#                 (the lab registry: 5000:10.213.0.1:5000)
set -eu

# dockerd needs /sys and its cgroup (v1) hierarchies writable. --privileged gives that, but
# where the engine's own capability bounding set lacks a capability (this VM has no
# CAP_SYS_RESOURCE) Docker 20.10 cannot start a privileged container at all, and the lab runs
# the workers with every capability it has (--cap-add ALL --cap-drop SYS_RESOURCE,
# systempaths/seccomp/apparmor unconfined, all devices): then /sys and the cgroup mounts come
# read-only and are made writable here (bind remounts of this container's own mounts).
# (Harmless when they are writable already.)
mount -o remount,rw /sys 2>/dev/null || true
for d in /sys/fs/cgroup/*; do
    [ -d "$d" ] && mount -o remount,bind,rw "$d" 2>/dev/null || true
done

# A worker that was killed and is started again keeps its root filesystem: remove the pid
# files of the dockerd and containerd that died with it (they refuse to start otherwise).
rm -f /var/run/docker.pid /var/run/docker/containerd/containerd.pid

for fwd in ${LAB_FORWARD:-}; do
    lport=${fwd%%:*}
    target=${fwd#*:}
    socat "TCP-LISTEN:${lport},bind=127.0.0.1,fork,reuseaddr" "TCP:${target}" &
done

exec dockerd "$@"
