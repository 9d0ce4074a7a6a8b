#!/usr/bin/env bash
# A real multi-node Docker Swarm on this one machine, for tests (docs/swarm-lab.md):
#   - this host's engine is the manager (active: gpulab places nothing there but its notebook
#     gateway attaches to overlays there; a drained node cannot), advertised on a
#     lab bridge network (gpulab-lab, 10.213.0.0/24, the host is 10.213.0.1);
#   - N workers are Docker-in-Docker containers gpulab-lab-worker-1..N (image gpulab-lab/dind:1,
#     built here from images/dind), each with its own volume at /var/lib/docker, its own dockerd
#     (also on tcp://<its lab IP>:2376, TLS client certificates only) and a fake GPU
#     inventory as the node label org.gpulab.gpus=0,1;
#   - a registry (Debian's docker-registry, distribution 2.8) on 127.0.0.1:5000 holds the local
#     gpulab images under the same names everywhere: 127.0.0.1:5000/gpulab/python:3.11 works on
#     the host and on every worker (socat forwards each worker's 127.0.0.1:5000 to the host),
#     and the images are pre-pulled on every worker.
#
# Usage: scripts/swarm-lab.sh up [N] [--facts PATH]   start or converge to N workers (default 2)
#        scripts/swarm-lab.sh image                   build the worker image (or find it up to
#                                                     date) and print its name
#        scripts/swarm-lab.sh status [--facts PATH]   print the facts; exit 1 when not all up
#        scripts/swarm-lab.sh down [--force]          remove all the lab made; idempotent (refused
#                                                     while a pytest session uses the lab)
# `up` and `status` print the lab's facts as JSON on stdout and write them to the facts file
# (manager, registry, network, workers with container, node_id, hostname, addr, docker_url).
# Progress goes to stderr. `up` is idempotent: a second `up` checks and returns in seconds.
# `down` leaves this host's engine as it was (no swarm, no lab network, volumes or image tags)
# and keeps the gpulab-lab/dind image and the installed Debian packages.
#
# Environment:
#   SWARM_LAB_DIR            state, logs, registry storage   (default /tmp/gpulab-swarm-lab)
#   SWARM_LAB_FACTS          facts file                      (default $SWARM_LAB_DIR/facts.json)
#   SWARM_LAB_REGISTRY_PORT  registry port, same on host and nodes (default 5000)
#   SWARM_LAB_SUBNET         lab bridge, a /24               (default 10.213.0.0/24)
#   SWARM_LAB_ADDR_POOL      swarm's pool for overlay networks, /24 each (default 10.214.0.0/16)
#   SWARM_LAB_HEARTBEAT      dispatcher heartbeat period     (default 2s: a dead node is Down
#                            after about 3 heartbeats)
#   GPUS_PER_NODE            fake GPUs per worker: label org.gpulab.gpus=0,..,N-1 (default 2)
#   SWARM_LAB_IMAGES         local images to push and pre-pull (default gpulab/debian:bookworm
#                            gpulab/python:3.11 gpulab/sync:<gpulab version>); missing gpulab
#                            images are built with scripts/build-images.sh
#   SWARM_LAB_DIND_IMAGE     worker image                    (default gpulab-lab/dind:1)
#   SWARM_LAB_LOCK           one command at a time holds it  (default /tmp/gpulab-swarm-lab.lock)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LAB=gpulab-lab
LAB_LABEL=org.gpulab.swarm-lab
LAB_DIR=${SWARM_LAB_DIR:-/tmp/gpulab-swarm-lab}
LOCK=${SWARM_LAB_LOCK:-/tmp/gpulab-swarm-lab.lock}
FACTS=${SWARM_LAB_FACTS:-$LAB_DIR/facts.json}
PORT=${SWARM_LAB_REGISTRY_PORT:-5000}
SUBNET=${SWARM_LAB_SUBNET:-10.213.0.0/24}
ADDR_POOL=${SWARM_LAB_ADDR_POOL:-10.214.0.0/16}
HEARTBEAT=${SWARM_LAB_HEARTBEAT:-2s}
GPUS_PER_NODE=${GPUS_PER_NODE:-2}
DIND_IMAGE=${SWARM_LAB_DIND_IMAGE:-gpulab-lab/dind:1}
GPULAB_VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$ROOT/src/gpulab/__init__.py")
IMAGES=${SWARM_LAB_IMAGES:-gpulab/debian:bookworm gpulab/python:3.11 gpulab/sync:$GPULAB_VERSION}
NETWORK=$LAB
BRIDGE=${LAB}0
NET_PREFIX=${SUBNET%.0/24}
GATEWAY=$NET_PREFIX.1
REGISTRY=127.0.0.1:$PORT
# Each worker's own engine: its docker0 and its local networks stay clear of every lab range.
WORKER_BIP_PREFIX=10.216
WORKER_LOCAL_POOL=10.217.0.0/16
STATE=$LAB_DIR/state
# The workers' engines take TLS with client certificates only (dockerd --tlsverify), as gpulab
# requires of a node's engine: a test CA, one server certificate for every worker address and
# a client certificate, made once here.
TLS_DIR=$LAB_DIR/tls
ENGINE_PORT=2376

T_START=$SECONDS
log() { printf '[swarm-lab %4ds] %s\n' "$((SECONDS - T_START))" "$*" >&2; }
die() { printf '[swarm-lab] ERROR: %s\n' "$*" >&2; exit 1; }
PY=$(command -v python3 || echo /usr/bin/python3)

worker_name() { echo "$LAB-worker-$1"; }
worker_ip() { echo "$NET_PREFIX.$((10 + $1))"; }
gpu_list() { [ "$GPUS_PER_NODE" -gt 0 ] && seq -s, 0 $((GPUS_PER_NODE - 1)) || true; }

state_get() { [ -f "$STATE" ] && sed -n "s/^$1=//p" "$STATE" | tail -n 1 || true; }
state_set() {
    mkdir -p "$LAB_DIR"
    { [ -f "$STATE" ] && grep -v "^$1=" "$STATE" || true; echo "$1=$2"; } >"$STATE.new"
    mv "$STATE.new" "$STATE"
}

# A pid from the state file, only while it is still the process we started (cmdline matches).
live_pid() {
    local pid
    pid=$(state_get "$1")
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$2" \
        && echo "$pid"
}

swarm_state() { docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null || echo unknown; }
self_node() { docker info --format '{{.Swarm.NodeID}}'; }
# The lab made the swarm when the host engine's node carries the label
# org.gpulab.swarm-lab=manager, or (just after init) when the state file names its cluster id.
swarm_is_ours() {
    [ "$(swarm_state)" = active ] || return 1
    [ "$(docker node inspect self --format "{{index .Spec.Labels \"$LAB_LABEL\"}}" 2>/dev/null)" = manager ] \
        || { [ -n "$(state_get swarm_id)" ] \
            && [ "$(docker info --format '{{.Swarm.Cluster.ID}}')" = "$(state_get swarm_id)" ]; }
}

registry_up() { curl -fsS -o /dev/null --max-time 3 "http://$REGISTRY/v2/" 2>/dev/null; }

need_engine() {
    command -v docker >/dev/null || die "docker client not found (run scripts/ensure-docker.sh)"
    timeout 15 docker info >/dev/null 2>&1 || die "no Docker engine answers (run scripts/ensure-docker.sh)"
}

# ---------------------------------------------------------------------------------------------
# Packages, the worker image
# ---------------------------------------------------------------------------------------------
ensure_packages() {
    local missing=()
    command -v docker-registry >/dev/null || missing+=(docker-registry)
    command -v socat >/dev/null || missing+=(socat)
    command -v curl >/dev/null || missing+=(curl)
    command -v openssl >/dev/null || missing+=(openssl)  # the workers' engine certificates
    [ ${#missing[@]} = 0 ] && return
    [ "$(id -u)" = 0 ] || die "missing ${missing[*]}; installing needs root"
    log "installing Debian's ${missing[*]} (apt-get) ..."
    mkdir -p "$LAB_DIR"
    export DEBIAN_FRONTEND=noninteractive
    # Try the existing package lists first; refresh them only when that fails.
    apt-get install -y -q --no-install-recommends "${missing[@]}" >"$LAB_DIR/apt.log" 2>&1 \
        || { apt-get update -q >>"$LAB_DIR/apt.log" 2>&1 \
            && apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$LAB_DIR/apt.log" 2>&1; } \
        || { tail -n 20 "$LAB_DIR/apt.log" >&2; die "apt-get install ${missing[*]} failed"; }
}

# gpulab-lab/dind:1 from images/dind on the local Debian image, rebuilt when its Dockerfile,
# entry point or base changed (label org.gpulab.build-hash, as in scripts/build-images.sh).
ensure_dind_image() {
    local base=${SWARM_LAB_DIND_BASE:-${GPULAB_DEBIAN_IMAGE:-gpulab/debian:bookworm}}
    if ! docker image inspect "$base" >/dev/null 2>&1; then
        log "base image $base is missing: scripts/build-images.sh debian ..."
        "$ROOT/scripts/build-images.sh" debian
    fi
    local hash have
    hash=$( { cat "$ROOT/images/dind/Dockerfile" "$ROOT/images/dind/entrypoint.sh"
        docker image inspect --format '{{.Id}}' "$base"; } | sha256sum | cut -c1-16)
    have=$(docker image inspect --format '{{index .Config.Labels "org.gpulab.build-hash"}}' \
        "$DIND_IMAGE" 2>/dev/null || true)
    [ "$have" = "$hash" ] && return
    local t0=$SECONDS old
    old=$(docker image inspect --format '{{.Id}}' "$DIND_IMAGE" 2>/dev/null || true)
    mkdir -p "$LAB_DIR"
    log "building $DIND_IMAGE (images/dind, BASE_IMAGE=$base; log: $LAB_DIR/build-dind.log) ..."
    DOCKER_BUILDKIT=0 docker build --force-rm --build-arg "BASE_IMAGE=$base" \
        --label "org.gpulab.build-hash=$hash" -t "$DIND_IMAGE" "$ROOT/images/dind" \
        >"$LAB_DIR/build-dind.log" 2>&1 \
        || { tail -n 30 "$LAB_DIR/build-dind.log" >&2; die "docker build $DIND_IMAGE failed"; }
    log "built $DIND_IMAGE in $((SECONDS - t0)) s"
    # The image it replaces: removed once no worker runs it (ensure_workers replaces them).
    [ -z "$old" ] || [ "$old" = "$(docker image inspect --format '{{.Id}}' "$DIND_IMAGE")" ] \
        || OLD_DIND_IMAGE=$old
}

# How the workers run. --privileged where the engine can give it; Docker 20.10 cannot start a
# privileged container when its own capability bounding set lacks one (this VM has no
# CAP_SYS_RESOURCE): then every capability it has, unconfined, all devices (the entry point
# makes /sys and the cgroup mounts writable).
worker_run_flags() {
    local mode
    mode=$(state_get worker_mode)
    if [ -z "$mode" ]; then
        if docker run --rm --privileged --network none --entrypoint true "$DIND_IMAGE" >/dev/null 2>&1; then
            mode=privileged
        else
            mode=caps
        fi
        state_set worker_mode "$mode"
        log "workers run with: $mode"
    fi
    if [ "$mode" = privileged ]; then
        WORKER_FLAGS=(--privileged)
    else
        WORKER_FLAGS=(--cap-add ALL --cap-drop SYS_RESOURCE --security-opt seccomp=unconfined
            --security-opt apparmor=unconfined --security-opt systempaths=unconfined
            --device-cgroup-rule 'a *:* rwm')
    fi
}

# ---------------------------------------------------------------------------------------------
# Network, registry, swarm
# ---------------------------------------------------------------------------------------------
ensure_network() {
    local have
    have=$(docker network inspect --format '{{range .IPAM.Config}}{{.Subnet}}{{end}}' "$NETWORK" 2>/dev/null || true)
    if [ -n "$have" ]; then
        [ "$have" = "$SUBNET" ] || die "network $NETWORK exists with subnet $have, not $SUBNET (scripts/swarm-lab.sh down removes it)"
        return
    fi
    log "creating network $NETWORK ($SUBNET, bridge $BRIDGE, this host is $GATEWAY) ..."
    docker network create --driver bridge --subnet "$SUBNET" --gateway "$GATEWAY" \
        -o "com.docker.network.bridge.name=$BRIDGE" --label "$LAB_LABEL=network" "$NETWORK" >/dev/null
}

ensure_registry() {
    mkdir -p "$LAB_DIR/registry/data"
    local pid
    pid=$(live_pid registry_pid "$LAB_DIR/registry/config.yml" || true)
    if [ -z "$pid" ]; then
        registry_up && die "something else answers on $REGISTRY (set SWARM_LAB_REGISTRY_PORT)"
        cat >"$LAB_DIR/registry/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $LAB_DIR/registry/data
  delete:
    enabled: true
http:
  addr: $REGISTRY
EOF
        log "starting the registry on $REGISTRY (storage $LAB_DIR/registry/data) ..."
        setsid nohup docker-registry serve "$LAB_DIR/registry/config.yml" \
            >"$LAB_DIR/registry/registry.log" 2>&1 </dev/null 9>&- &
        state_set registry_pid $!
        local i
        for i in $(seq 100); do registry_up && break; sleep 0.1; done
        registry_up || { tail -n 20 "$LAB_DIR/registry/registry.log" >&2; die "the registry did not answer on $REGISTRY"; }
    fi
    # The nodes reach it through the host's address on the lab bridge.
    pid=$(live_pid socat_pid "TCP-LISTEN:$PORT,bind=$GATEWAY" || true)
    if [ -z "$pid" ]; then
        setsid nohup socat "TCP-LISTEN:$PORT,bind=$GATEWAY,fork,reuseaddr" "TCP:$REGISTRY" \
            >"$LAB_DIR/registry/socat.log" 2>&1 </dev/null 9>&- &
        state_set socat_pid $!
        sleep 0.2
        kill -0 "$(state_get socat_pid)" 2>/dev/null \
            || { cat "$LAB_DIR/registry/socat.log" >&2; die "socat could not listen on $GATEWAY:$PORT"; }
    fi
}

ensure_swarm() {
    local st
    st=$(swarm_state)
    if [ "$st" = active ]; then
        swarm_is_ours || die "this engine is already in a swarm that the lab did not create; leave it alone or run the lab on another engine"
        [ "$(docker info --format '{{.Swarm.ControlAvailable}}')" = true ] || die "this engine is in the lab's swarm but not a manager"
    elif [ "$st" = inactive ]; then
        # (kept from a first, failed attempt: that one saw the engine as it was)
        if [ -n "$(state_get gwbridge_before)" ]; then
            :
        elif docker network inspect docker_gwbridge >/dev/null 2>&1; then
            state_set gwbridge_before 1
        else
            state_set gwbridge_before 0
        fi
        log "docker swarm init --advertise-addr $GATEWAY --dispatcher-heartbeat $HEARTBEAT --default-addr-pool $ADDR_POOL ..."
        docker swarm init --advertise-addr "$GATEWAY" --listen-addr "$GATEWAY:2377" \
            --dispatcher-heartbeat "$HEARTBEAT" --default-addr-pool "$ADDR_POOL" \
            --default-addr-pool-mask-length 24 >/dev/null
        state_set swarm_id "$(docker info --format '{{.Swarm.Cluster.ID}}')"
        docker node update --label-add "$LAB_LABEL=manager" "$(self_node)" >/dev/null
    else
        die "this engine's swarm state is '$st'; fix it by hand (docker swarm leave --force?)"
    fi
    local want_ns have
    want_ns=$("$PY" -c 'import re,sys; v=sys.argv[1]; m={"ms":1e6,"s":1e9,"m":6e10}; n,u=re.fullmatch(r"([0-9.]+)(ms|s|m)",v).groups(); print(int(float(n)*m[u]))' "$HEARTBEAT")
    have=$(docker info --format '{{.Swarm.Cluster.Spec.Dispatcher.HeartbeatPeriod}}')
    [ "$have" = "$want_ns" ] || docker swarm update --dispatcher-heartbeat "$HEARTBEAT" >/dev/null
    # active, not drained: a drained node cannot attach a container to an overlay (moby#35889),
    # and gpulab's notebook gateway runs here, attached to users' overlays. gpulab places no
    # workload on the hub's own node anyway (SwarmRuntime.nodes).
    [ "$(docker node inspect self --format '{{.Spec.Availability}}')" = active ] \
        || docker node update --availability active "$(self_node)" >/dev/null
}

# ---------------------------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------------------------
worker_exec() { timeout "${EXEC_TIMEOUT:-120}" docker exec "$@"; }
inner_swarm() { worker_exec "$1" docker info --format '{{.Swarm.LocalNodeState}} {{.Swarm.NodeID}}' 2>/dev/null || true; }

ensure_tls() {
    [ -s "$TLS_DIR/client-key.pem" ] && return
    command -v openssl >/dev/null || die "openssl is missing (apt-get install openssl)"
    log "making the lab's TLS CA and the workers' engine certificates in $TLS_DIR ..."
    rm -rf "$TLS_DIR.new" && mkdir -p "$TLS_DIR.new" && (
        cd "$TLS_DIR.new"
        local sans="IP:127.0.0.1" i
        for i in $(seq 1 99); do sans="$sans,IP:$(worker_ip "$i")"; done
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=gpulab-lab CA" \
            -keyout ca-key.pem -out ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=gpulab-lab worker" \
            -keyout server-key.pem -out server.csr 2>/dev/null
        printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$sans" >server.ext
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 3650 \
            -extfile server.ext -out server-cert.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=gpulab-lab client" \
            -keyout client-key.pem -out client.csr 2>/dev/null
        printf 'extendedKeyUsage=clientAuth\n' >client.ext
        openssl x509 -req -in client.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 3650 \
            -extfile client.ext -out client-cert.pem 2>/dev/null
        rm -f ./*.csr ./*.ext ./*.srl
        chmod 0644 ca.pem server-cert.pem client-cert.pem
        chmod 0600 ca-key.pem client-key.pem
        chmod 0644 server-key.pem  # read by the workers' dockerd (root in their container)
    ) || die "openssl could not make the lab's certificates"
    rm -rf "$TLS_DIR" && mv "$TLS_DIR.new" "$TLS_DIR"
}

start_worker() {
    local i=$1 name ip dind_id cid running
    name=$(worker_name "$i")
    ip=$(worker_ip "$i")
    dind_id=$(docker image inspect --format '{{.Id}}' "$DIND_IMAGE")
    cid=$(docker inspect --format '{{.Image}}' "$name" 2>/dev/null || true)
    if [ -n "$cid" ] && ! docker inspect --format '{{json .Args}}' "$name" | grep -q -- --tlsverify; then
        log "$name's engine takes plain TCP: replacing it with one that takes TLS only"
        docker rm -f -v "$name" >/dev/null
        docker volume rm -f "$name" >/dev/null
        cid=
    fi
    if [ -n "$cid" ] && [ "$cid" != "$dind_id" ]; then
        log "$name runs an older $DIND_IMAGE: replacing it (and its volume)"
        docker rm -f -v "$name" >/dev/null
        docker volume rm -f "$name" >/dev/null
        cid=
    fi
    if [ -z "$cid" ]; then
        docker volume create --label "$LAB_LABEL=worker" "$name" >/dev/null
        docker run -d --name "$name" --hostname "$name" --label "$LAB_LABEL=worker" \
            --network "$NETWORK" --ip "$ip" -v "$name:/var/lib/docker" "${WORKER_FLAGS[@]}" \
            -v "$TLS_DIR:/etc/gpulab-lab-tls:ro" -e "LAB_FORWARD=$PORT:$GATEWAY:$PORT" \
            "$DIND_IMAGE" --host unix:///var/run/docker.sock --host "tcp://$ip:$ENGINE_PORT" \
            --tlsverify --tlscacert /etc/gpulab-lab-tls/ca.pem \
            --tlscert /etc/gpulab-lab-tls/server-cert.pem --tlskey /etc/gpulab-lab-tls/server-key.pem \
            --bip "$WORKER_BIP_PREFIX.$i.1/24" --default-address-pool "base=$WORKER_LOCAL_POOL,size=24" \
            >/dev/null
        return
    fi
    running=$(docker inspect --format '{{.State.Running}}' "$name")
    if [ "$running" != true ]; then
        log "$name exists but is stopped: starting it (it rejoins the swarm as the same node)"
        docker start "$name" >/dev/null
    fi
}

wait_dockerd() {
    local name=$1 t0=$SECONDS
    until worker_exec "$name" docker version >/dev/null 2>&1; do
        (( SECONDS - t0 < 60 )) || { docker logs --tail 30 "$name" >&2; die "dockerd in $name did not answer within 60 s"; }
        sleep 0.2
    done
}

join_worker() {
    local i=$1 name ip st token
    name=$(worker_name "$i")
    ip=$(worker_ip "$i")
    st=$(inner_swarm "$name")
    # A member (or joining) of this swarm: its managers include this engine's node.
    case "$st" in
        active* | pending*)
            [[ "$(worker_exec "$name" docker info --format '{{range .Swarm.RemoteManagers}}{{.NodeID}} {{end}}' 2>/dev/null)" \
                == *"$(self_node)"* ]] && return ;;
    esac
    token=$(docker swarm join-token -q worker)
    # A stale membership (the swarm of an earlier lab) must go first.
    case "$st" in
        inactive*) ;;
        *)
            log "$name is in another swarm ($st): leaving it"
            worker_exec "$name" docker swarm leave --force >/dev/null 2>&1 || true ;;
    esac
    worker_exec "$name" docker swarm join --token "$token" --advertise-addr "$ip" \
        --listen-addr "$ip:2377" "$GATEWAY:2377" >/dev/null \
        || { docker logs --tail 30 "$name" >&2; die "$name could not join the swarm"; }
}

# node id of a worker container, as the worker's own engine reports it
worker_node_id() { inner_swarm "$1" | awk '$1 == "active" {print $2}'; }

ensure_workers() {
    local n=$1 i name t0=$SECONDS
    worker_run_flags
    # Workers above N go (their nodes are removed from the swarm below).
    local existing
    existing=$(docker ps -a --filter "label=$LAB_LABEL=worker" --format '{{.Names}}')
    for name in $existing; do
        i=${name##*-}
        if ! [[ "$i" =~ ^[0-9]+$ ]] || (( i > n )); then
            log "removing $name (up to $n workers)"
            docker rm -f -v "$name" >/dev/null
            docker volume rm -f "$name" >/dev/null 2>&1 || true
        fi
    done
    ensure_tls
    for i in $(seq "$n"); do start_worker "$i"; done
    for i in $(seq "$n"); do wait_dockerd "$(worker_name "$i")"; done
    local tj=$SECONDS
    for i in $(seq "$n"); do join_worker "$i" & PIDS+=($!); done
    wait_all "joining the swarm"
    # Wait until every worker is a Ready node; remove nodes of workers that are gone.
    local ids=() want id deadline=$((SECONDS + 90))
    for i in $(seq "$n"); do
        name=$(worker_name "$i")
        id=
        while [ -z "$id" ]; do
            id=$(worker_node_id "$name")
            [ -n "$id" ] || { (( SECONDS < deadline )) || die "$name did not become an active swarm member"; sleep 0.3; }
        done
        ids+=("$id")
    done
    local node_id node_host
    while read -r node_id node_host; do
        [ -n "$node_id" ] || continue
        [[ " ${ids[*]} " == *" $node_id "* ]] && continue
        [ "$node_id" = "$(docker info --format '{{.Swarm.NodeID}}')" ] && continue
        log "removing the stale node $node_id ($node_host)"
        docker node rm --force "$node_id" >/dev/null 2>&1 || true
    done < <(docker node ls --format '{{.ID}} {{.Hostname}}')
    want=$(gpu_list)
    for id in "${ids[@]}"; do
        until [ "$(docker node inspect "$id" --format '{{.Status.State}}' 2>/dev/null)" = ready ]; do
            (( SECONDS < deadline )) || die "node $id is not Ready after 90 s"
            sleep 0.3
        done
        local labels
        labels=$(docker node inspect "$id" --format "{{index .Spec.Labels \"$LAB_LABEL\"}}|{{index .Spec.Labels \"org.gpulab.gpus\"}}")
        if [ "$labels" != "worker|$want" ]; then
            if [ -n "$want" ]; then
                docker node update --label-add "$LAB_LABEL=worker" --label-add "org.gpulab.gpus=$want" "$id" >/dev/null
            else
                docker node update --label-add "$LAB_LABEL=worker" --label-rm org.gpulab.gpus "$id" >/dev/null 2>&1 \
                    || docker node update --label-add "$LAB_LABEL=worker" "$id" >/dev/null
            fi
        fi
    done
    log "$n workers Ready (containers and dockerd $((tj - t0)) s, swarm join and Ready $((SECONDS - tj)) s)"
}

# wait_all WHAT: wait for the background jobs whose pids are in PIDS (not `jobs -p`: the
# registry and socat were started in the background by this shell too).
PIDS=()
wait_all() {
    local pid fail=0
    for pid in "${PIDS[@]}"; do wait "$pid" || fail=1; done
    PIDS=()
    [ "$fail" = 0 ] || die "$1 failed (see above)"
}

# ---------------------------------------------------------------------------------------------
# Images: push to the registry, pre-pull on every worker
# ---------------------------------------------------------------------------------------------
build_kind() {
    case "$1" in
        "${GPULAB_DEBIAN_IMAGE:-gpulab/debian:bookworm}") echo debian ;;
        "${GPULAB_PYTHON_IMAGE:-gpulab/python:3.11}") echo python ;;
        "${GPULAB_PYTORCH_IMAGE:-gpulab/pytorch:2.13}") echo pytorch ;;
        "${GPULAB_SYNC_IMAGE:-gpulab/sync:$GPULAB_VERSION}") echo sync ;;
    esac
}

# digest of NAME:TAG in the registry ('' when absent)
registry_digest() {
    local name=${1%:*} tag=${1##*:}
    curl -fsS -I --max-time 5 \
        -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
        "http://$REGISTRY/v2/$name/manifests/$tag" 2>/dev/null \
        | tr -d '\r' | sed -n 's/^[Dd]ocker-[Cc]ontent-[Dd]igest: //p' || true
}

push_images() {
    local img kind missing=() t0=$SECONDS pushed=0
    for img in $IMAGES; do
        docker image inspect "$img" >/dev/null 2>&1 && continue
        kind=$(build_kind "$img")
        [ -n "$kind" ] || die "image $img is missing and scripts/build-images.sh does not build it"
        missing+=("$kind")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "images missing: scripts/build-images.sh ${missing[*]} ..."
        "$ROOT/scripts/build-images.sh" "${missing[@]}"
    fi
    for img in $IMAGES; do
        local digest
        digest=$(registry_digest "$img")
        if [ -n "$digest" ] && docker image inspect --format '{{join .RepoDigests " "}}' "$img" \
            | tr ' ' '\n' | grep -qx "$REGISTRY/${img%:*}@$digest"; then
            continue
        fi
        docker tag "$img" "$REGISTRY/$img"
        docker push -q "$REGISTRY/$img" >"$LAB_DIR/push.log" 2>&1 \
            || { cat "$LAB_DIR/push.log" >&2; die "docker push $REGISTRY/$img failed"; }
        pushed=$((pushed + 1))
    done
    [ "$pushed" = 0 ] || log "pushed $pushed image(s) to $REGISTRY in $((SECONDS - t0)) s"
    TIME_PUSH=$((SECONDS - t0))
}

pull_on_worker() {
    local name=$1 img want have
    for img in $IMAGES; do
        want=$(docker image inspect --format '{{.Id}}' "$img")
        have=$(worker_exec "$name" docker image inspect --format '{{.Id}}' "$REGISTRY/$img" 2>/dev/null || true)
        [ "$have" = "$want" ] && continue
        EXEC_TIMEOUT=590 worker_exec "$name" docker pull -q "$REGISTRY/$img" >/dev/null \
            || die "$name: docker pull $REGISTRY/$img failed"
        have=$(worker_exec "$name" docker image inspect --format '{{.Id}}' "$REGISTRY/$img")
        [ "$have" = "$want" ] || die "$name pulled $REGISTRY/$img as $have, not $want"
    done
}

pull_images() {
    local n=$1 i t0=$SECONDS
    # All workers at once: the pulls are bound by decompression, one core each.
    for i in $(seq "$n"); do pull_on_worker "$(worker_name "$i")" & PIDS+=($!); done
    wait_all "pre-pulling the images"
    TIME_PULL=$((SECONDS - t0))
    (( TIME_PULL < 2 )) || log "pre-pulled the images on $n worker(s) in $TIME_PULL s"
}

# ---------------------------------------------------------------------------------------------
# Facts
# ---------------------------------------------------------------------------------------------
# Prints the facts as JSON (and writes them to $FACTS); returns 1 when the lab is not all up.
facts() {
    local ok=1 problems=() workers=() name ip id host state avail gpus
    registry_up || { ok=0; problems+=("registry does not answer on $REGISTRY"); }
    swarm_is_ours || { ok=0; problems+=("this engine is not the manager of the lab's swarm"); }
    local mgr_id="" mgr_host="" swarm_id=""
    if swarm_is_ours; then
        mgr_id=$(docker info --format '{{.Swarm.NodeID}}')
        mgr_host=$(docker node inspect self --format '{{.Description.Hostname}}')
        swarm_id=$(docker info --format '{{.Swarm.Cluster.ID}}')
    fi
    for name in $(docker ps -a --filter "label=$LAB_LABEL=worker" --format '{{.Names}}' | sort -t- -k4 -n); do
        ip=$(docker inspect --format "{{(index .NetworkSettings.Networks \"$NETWORK\").IPAddress}}" "$name" 2>/dev/null || true)
        id=$(worker_node_id "$name")
        # a stopped or killed worker: the manager still knows its node by hostname
        [ -n "$id" ] || [ -z "$mgr_id" ] \
            || id=$(docker node ls --filter "name=$name" --format '{{.ID}} {{.Hostname}}' | awk -v h="$name" '$2 == h {print $1; exit}')
        host=
        state=missing
        avail=
        gpus=
        if [ -n "$id" ] && [ -n "$mgr_id" ]; then
            IFS='|' read -r host state avail gpus < <(docker node inspect "$id" --format \
                "{{.Description.Hostname}}|{{.Status.State}}|{{.Spec.Availability}}|{{index .Spec.Labels \"org.gpulab.gpus\"}}" 2>/dev/null || echo "|missing||")
        fi
        [ "$state" = ready ] || { ok=0; problems+=("$name: node ${id:-?} is ${state}"); }
        workers+=("$name|$id|$host|$ip|$state|$avail|$gpus")
    done
    [ ${#workers[@]} -gt 0 ] || { ok=0; problems+=("no workers"); }
    mkdir -p "$(dirname "$FACTS")"
    FACTS_OK=$ok MGR_ID=$mgr_id MGR_HOST=$mgr_host SWARM_ID=$swarm_id \
        PROBLEMS=$(printf '%s\n' "${problems[@]}") WORKERS=$(printf '%s\n' "${workers[@]}") \
        GATEWAY=$GATEWAY HEARTBEAT=$HEARTBEAT ADDR_POOL=$ADDR_POOL REGISTRY=$REGISTRY PORT=$PORT \
        NETWORK=$NETWORK SUBNET=$SUBNET GPUS_PER_NODE=$GPUS_PER_NODE IMAGES=$IMAGES \
        TIMINGS=${TIMINGS:-} MGR_DOCKER_HOST=${DOCKER_HOST:-unix:///var/run/docker.sock} \
        ENGINE_PORT=$ENGINE_PORT TLS_DIR=$TLS_DIR \
        "$PY" - "$FACTS" <<'EOF'
import json, os, sys

e = os.environ
facts = {
    "ok": e["FACTS_OK"] == "1",
    "problems": [p for p in e["PROBLEMS"].splitlines() if p],
    "manager": {"node_id": e["MGR_ID"], "hostname": e["MGR_HOST"], "addr": e["GATEWAY"],
                "docker_host": e["MGR_DOCKER_HOST"]},
    "swarm": {"id": e["SWARM_ID"], "heartbeat": e["HEARTBEAT"],
              "default_addr_pool": e["ADDR_POOL"]},
    "registry": {"addr": e["REGISTRY"], "prefix": e["REGISTRY"] + "/",
                 "upstream": f"{e['GATEWAY']}:{e['PORT']}"},
    "network": {"name": e["NETWORK"], "subnet": e["SUBNET"], "gateway": e["GATEWAY"]},
    "gpus_per_node": int(e["GPUS_PER_NODE"]),
    # the workers' engines take TLS client certificates only (docker_url with these files)
    "engine_tls": {"ca": e["TLS_DIR"] + "/ca.pem", "cert": e["TLS_DIR"] + "/client-cert.pem",
                   "key": e["TLS_DIR"] + "/client-key.pem"},
    "images": [e["REGISTRY"] + "/" + i for i in e["IMAGES"].split()],
    "workers": [],
    "timings_s": {k: int(v) for k, v in (kv.split("=") for kv in e["TIMINGS"].split())},
}
for line in e["WORKERS"].splitlines():
    if not line:
        continue
    name, node_id, hostname, addr, state, availability, gpus = line.split("|")
    facts["workers"].append({
        "container": name, "node_id": node_id, "hostname": hostname, "addr": addr,
        "docker_url": f"tcp://{addr}:{e['ENGINE_PORT']}" if addr else "", "state": state,
        "availability": availability, "gpus": gpus,
    })
text = json.dumps(facts, indent=2)
path = sys.argv[1]
with open(path + ".new", "w") as f:
    f.write(text + "\n")
os.replace(path + ".new", path)
print(text)
EOF
    [ "$ok" = 1 ]
}

# ---------------------------------------------------------------------------------------------
cmd_up() {
    local n=$1
    [[ "$n" =~ ^[1-9][0-9]?$ ]] || die "up: N must be 1..99 (got '$n')"
    [[ "$GPUS_PER_NODE" =~ ^[0-9]+$ ]] || die "GPUS_PER_NODE must be a number"
    [[ "$SUBNET" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.0/24$ ]] || die "SWARM_LAB_SUBNET must be a /24 like 10.213.0.0/24"
    need_engine
    [ "$(id -u)" = 0 ] || die "the lab needs root (packages, the registry, the engine)"
    # Refuse before creating anything when the engine is in somebody else's swarm.
    if [ "$(swarm_state)" = active ] && ! swarm_is_ours; then
        die "this engine is already in a swarm that the lab did not create; leave it alone or run the lab on another engine"
    fi
    mkdir -p "$LAB_DIR"
    local t=$SECONDS t_img t_reg t_swarm t_workers
    ensure_packages
    ensure_dind_image
    t_img=$((SECONDS - t)); t=$SECONDS
    ensure_network
    ensure_registry
    t_reg=$((SECONDS - t)); t=$SECONDS
    ensure_swarm
    t_swarm=$((SECONDS - t)); t=$SECONDS
    ensure_workers "$n"
    t_workers=$((SECONDS - t))
    [ -z "${OLD_DIND_IMAGE:-}" ] || docker rmi "$OLD_DIND_IMAGE" >/dev/null 2>&1 || true
    TIME_PUSH=0 TIME_PULL=0
    push_images
    pull_images "$n"
    # the notebook gateway runs on the manager (this engine): built here, not pushed
    "$ROOT/scripts/build-images.sh" proxy >"$LAB_DIR/build-proxy.log" 2>&1 \
        || { cat "$LAB_DIR/build-proxy.log" >&2; die "scripts/build-images.sh proxy failed"; }
    TIMINGS="total=$((SECONDS - T_START)) packages_and_dind_image=$t_img network_and_registry=$t_reg swarm=$t_swarm workers=$t_workers push=$TIME_PUSH pull=$TIME_PULL"
    facts || die "the lab is not all up (facts above)"
    log "up: $n worker(s), registry $REGISTRY, facts in $FACTS ($((SECONDS - T_START)) s)"
}

cmd_down() {
    need_engine
    # pytest sessions using the lab register their pid here (tests/swarm/conftest.py)
    local holders=() f
    for f in "$LOCK.holders"/*; do
        [ -e "$f" ] || continue
        if kill -0 "${f##*/}" 2>/dev/null; then holders+=("${f##*/}"); else rm -f "$f"; fi
    done
    if [ ${#holders[@]} -gt 0 ] && [ "$FORCE" != 1 ]; then
        die "pytest session(s) ${holders[*]} use the lab now (their pids in $LOCK.holders); 'down --force' takes it down anyway"
    fi
    local name
    for name in $(docker ps -a --filter "label=$LAB_LABEL=worker" --format '{{.Names}}'); do
        docker rm -f -v "$name" >/dev/null
    done
    for name in $(docker volume ls -q --filter "label=$LAB_LABEL=worker"); do
        docker volume rm -f "$name" >/dev/null
    done
    if swarm_is_ours; then
        log "leaving the lab's swarm"
        docker swarm leave --force >/dev/null
        # swarm init made docker_gwbridge; it stays behind after leave
        if [ "$(state_get gwbridge_before)" = 0 ] \
            && [ -z "$(docker network inspect --format '{{range .Containers}}x{{end}}' docker_gwbridge 2>/dev/null)" ]; then
            docker network rm docker_gwbridge >/dev/null 2>&1 || true
        fi
    elif [ "$(swarm_state)" = active ]; then
        log "this engine is in a swarm that the lab did not create: left as it is"
    fi
    local img
    for img in $(docker images --format '{{.Repository}}:{{.Tag}}' | grep "^$REGISTRY/" || true); do
        docker rmi "$img" >/dev/null 2>&1 || true
    done
    local pid
    for pid in $(live_pid socat_pid "TCP-LISTEN:$PORT,bind=$GATEWAY" || true) \
        $(live_pid registry_pid "$LAB_DIR/registry/config.yml" || true); do
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    done
    if docker network inspect "$NETWORK" >/dev/null 2>&1; then
        docker network rm "$NETWORK" >/dev/null || log "could not remove network $NETWORK (something still uses it)"
    fi
    rm -rf "$LAB_DIR"
    [ "$FACTS" = "$LAB_DIR/facts.json" ] || rm -f "$FACTS"
    log "down"
}

cmd_status() {
    need_engine
    facts
}

# ---------------------------------------------------------------------------------------------
CMD=${1:-}
[ $# -gt 0 ] && shift
N=2
FORCE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --force) FORCE=1 ;;
        --facts) FACTS=$2; shift ;;
        --facts=*) FACTS=${1#--facts=} ;;
        [0-9]*) N=$1 ;;
        *) die "unknown argument '$1' (try --help)" ;;
    esac
    shift
done

case "$CMD" in
    up | down | status)
        # One at a time; SWARM_LAB_LOCKED=1: the caller holds $LOCK already (tests/swarm).
        if [ "${SWARM_LAB_LOCKED:-0}" != 1 ]; then
            exec 9>>"$LOCK"
            flock -w 900 9 || die "timed out waiting for $LOCK"
        fi
        "cmd_$CMD" "$N"
        ;;
    image)
        # only the worker image (built or found up to date), for other tests' engines in a
        # container (tests/support/gpu_host.py: a stand-in GPU host); prints its name
        need_engine
        exec 9>>"$LOCK"
        flock -w 900 9 || die "timed out waiting for $LOCK"
        ensure_dind_image
        echo "$DIND_IMAGE"
        ;;
    -h | --help | help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
    *) echo "usage: $0 up [N] [--facts PATH] | down [--force] | status [--facts PATH] | image  (--help)" >&2; exit 2 ;;
esac
