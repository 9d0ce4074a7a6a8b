#!/usr/bin/env bash
# Build gpulab's notebook images locally, offline: no container registry is reachable here and
# pip inside `docker build` cannot reach PyPI, so
#   1. gpulab/debian:bookworm  is made with debootstrap + `docker import` (skipped if BASE_IMAGE),
#   2. gpulab/python:3.11      images/python  (jupyterhub + jupyterlab in /opt/gpulab/venv, and
#                              VS Code: code-server from scripts/build-code-server.sh),
#   3. gpulab/pytorch:2.13     images/pytorch (+ torch, numpy, tensorboard; CPU or CUDA build),
#   4. gpulab/sync:VERSION     images/sync (the sync helper),
#   +  gpulab/tensorflow:2.20  images/tensorflow (tensorflow-cpu or tensorflow[and-cuda]),
#                              gpulab/jax:0.7 images/jax (jax + CPU jaxlib, or jax[cuda12]),
#                              both on the python image,
#   5. gpulab/proxy:CHP        images/proxy (configurable-http-proxy, for a Swarm; only when
#                              named: the single-host hub runs the proxy as a process),
# with the Python wheels downloaded on the host (cache: .build/wheels/<image>/) and copied into
# the build context (.build/ctx/<image>/). Builds that do not need each other run side by side
# (debian beside code-server, python beside sync, pytorch beside tensorflow beside jax).
#
# An image is built only when it is missing, or when its Dockerfile, requirements or base image
# changed since it was built (label org.gpulab.build-hash); --force rebuilds all selected ones.
#
# Flavour of the framework images (pytorch, tensorflow, jax): "cuda" (the CUDA wheels from
# PyPI, which bundle CUDA's user-space libraries as nvidia-* wheels; several GB) on a host with
# an NVIDIA driver (/proc/driver/nvidia/version, or libnvidia-ml.so.1 known to ldconfig), else
# "cpu". --gpu cuda|cpu (make images GPU=cuda|cpu) chooses instead. Every framework image is
# labelled org.gpulab.flavour=cuda|cpu, and a CUDA one org.gpulab.cuda=MAJOR.MINOR (the CUDA
# runtime its wheels need). A tag that holds a CUDA image is never replaced by a CPU build the
# host's detection chose: it is kept (and said so); --gpu cpu replaces it.
#
# Usage: scripts/build-images.sh [--force] [--gpu auto|cuda|cpu] [--push REGISTRY] [debian|python|pytorch|sync|proxy|tensorflow|jax ...]
#        (default: debian python pytorch tensorflow jax sync)
# --push REGISTRY (host:port) tags every selected image REGISTRY/NAME:TAG and pushes it, so that
# every node of a Swarm pulls the same image (c.GpulabSettings.image_registry = "REGISTRY/").
# Environment:
#   BASE_IMAGE            base of gpulab/python instead of the debootstrap image (e.g.
#                         debian:bookworm-slim, a CUDA base); the debian step is then skipped
#   GPULAB_DEBIAN_IMAGE   tag of the debootstrap image   (default gpulab/debian:bookworm)
#   GPULAB_PYTHON_IMAGE   tag of the python image        (default gpulab/python:3.11)
#   GPULAB_PYTORCH_IMAGE  tag of the pytorch image       (default gpulab/pytorch:2.13)
#   GPULAB_GPU            auto|cuda|cpu, as --gpu (default auto: cuda where an NVIDIA driver is)
#   GPULAB_WHEEL_INDEX    the index the CUDA wheels come from (default https://pypi.org/simple;
#                         a site's mirror); the CUDA downloads ignore pip's own configuration
#   GPULAB_TORCH_CPU_INDEX  where a CPU build finds torch's +cpu wheel when pip's configuration
#                         offers none (default https://download.pytorch.org/whl/cpu)
#   GPULAB_BUILD_DIR      where wheels, build contexts, logs and the build lock live (default .build)
#   GPULAB_PY_VERSION     Python version the wheels are chosen for (default: the base image's
#                         python3, or the one its Dockerfile installs where the base has none)
#   GPULAB_BUILD_VERBOSE=1  stream docker build output (it always goes to .build/logs/)
#   GPULAB_TENSORFLOW_IMAGE, GPULAB_JAX_IMAGE  tags (default gpulab/tensorflow:2.20, gpulab/jax:0.7)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${GPULAB_BUILD_DIR:-$ROOT/.build}
LOGS=$BUILD/logs
DEBIAN_IMAGE=${GPULAB_DEBIAN_IMAGE:-gpulab/debian:bookworm}
PYTHON_IMAGE=${GPULAB_PYTHON_IMAGE:-gpulab/python:3.11}
PYTORCH_IMAGE=${GPULAB_PYTORCH_IMAGE:-gpulab/pytorch:2.13}
TENSORFLOW_IMAGE=${GPULAB_TENSORFLOW_IMAGE:-gpulab/tensorflow:2.20}
JAX_IMAGE=${GPULAB_JAX_IMAGE:-gpulab/jax:0.7}
PROXY_IMAGE=${GPULAB_PROXY_IMAGE:-gpulab/proxy:$( (sed -n 's/.*"version": "\(.*\)".*/\1/p' "$ROOT/.build/node/node_modules/configurable-http-proxy/package.json" 2>/dev/null || true) | head -1)}
SYNC_IMAGE=${GPULAB_SYNC_IMAGE:-gpulab/sync:$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$ROOT/src/gpulab/__init__.py")}
DEBIAN_SUITE=bookworm
DEBIAN_INCLUDE=python3,python3-venv,ca-certificates

FORCE=0
PUSH=
GPU=${GPULAB_GPU:-auto}
SELECTED=()
while [ $# -gt 0 ]; do
    arg=$1
    shift
    case "$arg" in
        --force | -f) FORCE=1 ;;
        --push) PUSH=${1:?--push needs a registry, e.g. --push registry.example.org:5000}; shift ;;
        --gpu) GPU=${1:?--gpu needs auto, cuda or cpu}; shift ;;
        --gpu=*) GPU=${arg#--gpu=} ;;
        debian | python | pytorch | sync | proxy | tensorflow | jax) SELECTED+=("$arg") ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-images: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done
[ ${#SELECTED[@]} -gt 0 ] || SELECTED=(debian python pytorch tensorflow jax sync)
selected() { [[ " ${SELECTED[*]} " == *" $1 "* ]]; }

T_START=$SECONDS
log() { printf '[build-images %4ds] %s\n' "$((SECONDS - T_START))" "$*" >&2; }
die() { printf '[build-images] ERROR: %s\n' "$*" >&2; exit 1; }

command -v docker >/dev/null || die "docker client not found (run scripts/ensure-docker.sh)"
timeout 15 docker info >/dev/null 2>&1 || die "no Docker engine answers (run scripts/ensure-docker.sh)"

mkdir -p "$BUILD" "$LOGS"
# One build at a time: a concurrent `make images` waits here, then finds the images built.
exec 9>"$BUILD/images.lock"
if ! flock -n 9; then
    log "another build holds $BUILD/images.lock; waiting for it ..."
    flock -w 3600 9 || die "timed out waiting for $BUILD/images.lock"
fi

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }
image_id() { docker image inspect --format '{{.Id}}' "$1" 2>/dev/null || echo "$1"; }
image_label() { docker image inspect --format "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true; }
sha() { sha256sum | cut -c1-16; }

# ---------------------------------------------------------------------------------------------
# 1. Debian base rootfs: debootstrap + docker import
# ---------------------------------------------------------------------------------------------
ensure_debootstrap() {
    if ! command -v debootstrap >/dev/null; then
        [ "$(id -u)" = 0 ] || die "debootstrap is missing and installing it needs root"
        log "installing debootstrap (apt-get) ..."
        "$ROOT/scripts/apt-install.sh" --log "$LOGS/apt-debootstrap.log" debootstrap \
            || die "apt-get install debootstrap failed"
    fi
}

build_debian() {
    local tag=$1
    ensure_debootstrap
    [ "$(id -u)" = 0 ] || die "debootstrap needs root"
    local dir=$BUILD/rootfs-$DEBIAN_SUITE t0=$SECONDS
    rm -rf "$dir"
    log "debootstrap --variant=minbase --include=$DEBIAN_INCLUDE $DEBIAN_SUITE (log: $LOGS/debootstrap.log) ..."
    if ! debootstrap --variant=minbase --include="$DEBIAN_INCLUDE" "$DEBIAN_SUITE" "$dir" \
        >"$LOGS/debootstrap.log" 2>&1; then
        tail -n 30 "$LOGS/debootstrap.log" >&2
        [ -f "$dir/debootstrap/debootstrap.log" ] && tail -n 30 "$dir/debootstrap/debootstrap.log" >&2
        rm -rf "$dir"
        die "debootstrap failed (log above)"
    fi
    # Downloaded .debs and package lists are not needed in the image (apt-get update refetches).
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/tmp/*
    log "debootstrap done in $((SECONDS - t0)) s; docker import -> $tag ..."
    tar -C "$dir" --numeric-owner -c . \
        | docker import --change 'CMD ["/bin/bash"]' \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'ENV LANG=C.UTF-8' \
            --message "debootstrap --variant=minbase --include=$DEBIAN_INCLUDE $DEBIAN_SUITE" \
            - "$tag" >/dev/null \
        || { rm -rf "$dir"; die "docker import failed"; }
    rm -rf "$dir"
    docker run --rm "$tag" python3 -c 'import venv, ensurepip, ssl' \
        || die "$tag: python3 with venv/ensurepip/ssl does not work"
    log "built $tag in $((SECONDS - t0)) s ($(docker image inspect --format '{{.Size}}' "$tag" | awk '{printf "%d MB", $1/1e6}'))"
}

# ---------------------------------------------------------------------------------------------
# 2./3. Dockerfile images with host-downloaded wheels
# ---------------------------------------------------------------------------------------------
PIP_PLATFORM_FLAGS=(--only-binary=:all: --implementation cp
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux_2_28_x86_64 --platform any)

# ---------------------------------------------------------------------------------------------
# The flavour of the framework images: cuda or cpu
# ---------------------------------------------------------------------------------------------
FRAMEWORKS="pytorch tensorflow jax"
# an NVIDIA driver on this host: its kernel module, or its NVML library known to the loader
nvidia_driver() {
    [ -e /proc/driver/nvidia/version ] && return 0
    local ldconfig
    ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
    [ -x "$ldconfig" ] && "$ldconfig" -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1'
}
case "$GPU" in
    auto)
        FLAVOUR_ASKED=0
        if nvidia_driver; then FLAVOUR=cuda; else FLAVOUR=cpu; fi ;;
    cuda | cpu) FLAVOUR=$GPU FLAVOUR_ASKED=1 ;;
    *) die "--gpu (GPU=, GPULAB_GPU) is auto, cuda or cpu, not '$GPU'" ;;
esac
# flavour_of NAME: what NAME is built as (only the framework images have a CUDA build)
flavour_of() { if [[ " $FRAMEWORKS " == *" $1 "* ]]; then echo "$FLAVOUR"; else echo ""; fi; }
# CUDA wheels come from PyPI (or GPULAB_WHEEL_INDEX) and from nowhere else: pip's own
# configuration (a machine's find-links, constraints, extra indexes) is not read for them.
WHEEL_INDEX=${GPULAB_WHEEL_INDEX:-https://pypi.org/simple}
# the index of PyTorch's CPU wheels, for a CPU build where pip's configuration has none
TORCH_CPU_INDEX=${GPULAB_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
pip_from_index() {
    env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL -u PIP_CONSTRAINT -u PIP_NO_INDEX \
        PIP_CONFIG_FILE=/dev/null python3 -m pip "$@"
}
# cuda_of_wheels DIR: the CUDA version (MAJOR.MINOR) of the CUDA runtime wheel among DIR's
# (nvidia-cuda-runtime-cu12 12.8.90 -> 12.8; the CUDA 13 wheels drop the -cuNN suffix)
cuda_of_wheels() {
    (cd "$1" && ls) | sed -n 's/^nvidia_cuda_runtime\(_cu[0-9][0-9]*\)\{0,1\}-\([0-9][0-9]*\)\.\([0-9][0-9]*\)\..*\.whl$/\2.\3/p' \
        | sort -V | tail -n 1
}
log "framework images: $FLAVOUR build ($(if [ "$FLAVOUR_ASKED" = 1 ]; then echo "asked: --gpu $GPU"; elif [ "$FLAVOUR" = cuda ]; then echo "this host has an NVIDIA driver"; else echo "no NVIDIA driver on this host; --gpu cuda builds the CUDA one"; fi))"

# base_python BASE NAME: "PYTHON GLIBC", the versions of a base image's python3 and C library;
# for the python image on a base without python3, those of the python3 its Dockerfile's "os"
# stage installs (the distribution's). Never a guess: the wheels must fit the interpreter the
# image really has. GPULAB_PY_VERSION names the Python instead (its C library is still asked).
base_python() {
    local base=$1 name=$2 v
    local ask='python3 -c "import platform; print(platform.python_version(), platform.libc_ver()[1])"'
    v=$(docker run --rm --entrypoint sh "$base" -c "$ask" 2>/dev/null || true)
    if [ -z "$v" ] && [ "$name" = python ] && image_exists "$base"; then
        local os_tag=gpulab-build/python-os:$$
        log "$base has no python3: building images/python's os stage to ask the one it installs ..."
        DOCKER_BUILDKIT=0 docker build -q --target os --build-arg "BASE_IMAGE=$base" -t "$os_tag" \
            - <"$ROOT/images/python/Dockerfile" >"$LOGS/python-os.log" 2>&1 \
            || { tail -n 20 "$LOGS/python-os.log" >&2; die "building the os stage of images/python on $base failed"; }
        v=$(docker run --rm --entrypoint sh "$os_tag" -c "$ask" 2>/dev/null || true)
        docker rmi "$os_tag" >/dev/null 2>&1 || true
    fi
    if [ -n "${GPULAB_PY_VERSION:-}" ]; then
        v="$GPULAB_PY_VERSION ${v#* }"
        [[ "$v" == *" "?* ]] || v="$GPULAB_PY_VERSION 2.28"
    fi
    [ -n "$v" ] || die "cannot tell the Python version of $base (is it there, with a python3?); set GPULAB_PY_VERSION"
    echo "$v"
}

# cuda_platforms GLIBC: every manylinux tag a C library of version GLIBC runs (the CUDA wheels
# are tagged manylinux_2_27, _2_28, ...: a fixed short list would miss some)
cuda_platforms() {
    local minor=${1#2.} i
    [[ "$minor" =~ ^[0-9]+$ ]] || minor=28
    for ((i = 17; i <= minor; i++)); do printf -- '--platform manylinux_2_%s_x86_64 ' "$i"; done
}

# wheels_dir NAME FLAVOUR: where NAME's wheels are kept (a CUDA set beside the CPU one)
wheels_dir() { echo "$BUILD/wheels/$1${2:+-$2}" | sed 's/-cpu$//'; }

# download_wheels NAME PYVERSION FLAVOUR GLIBC: wheels for NAME's requirements into its
# wheels_dir, skipped when that directory already holds a download for the same requirements
# and version.
download_wheels() {
    local name=$1 pyver=$2 flavour=$3 glibc=$4 req dir
    dir=$(wheels_dir "$name" "$flavour")
    req=$(requirements_of "$name" "$flavour")
    local stamp
    local platforms=("${PIP_PLATFORM_FLAGS[@]}")
    # shellcheck disable=SC2207 # words of the form --platform TAG
    if [ "$flavour" = cuda ]; then platforms+=($(cuda_platforms "$glibc")); fi
    stamp=$( { cat "$req"; echo "$pyver ${platforms[*]}"; if [ "$flavour" = cuda ]; then echo "$WHEEL_INDEX"; fi; } | sha)
    if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ] && ls "$dir"/*.whl >/dev/null 2>&1; then
        log "wheels for $name: cached in ${dir#"$ROOT"/} ($(ls "$dir"/*.whl | wc -l) wheels)"
        return
    fi
    rm -rf "$dir" && mkdir -p "$dir"
    local t0=$SECONDS pipcmd=(python3 -m pip download --progress-bar off -d "$dir"
        --python-version "$pyver" "${PIP_PLATFORM_FLAGS[@]}")
    if [ "$flavour" = cuda ]; then
        pipcmd=(pip_from_index download --progress-bar off -d "$dir" --index-url "$WHEEL_INDEX"
            --python-version "$pyver" "${platforms[@]}")
    fi
    # torch first and alone: a CPU build must resolve to a +cpu wheel (pip's configuration may
    # offer one, else PyTorch's CPU index), a CUDA build to PyPI's (CUDA) wheel.
    local torch_req
    torch_req=$(grep -E '^torch([=<>!~ ]|$)' "$req" || true)
    if [ -n "$torch_req" ]; then
        # a CPU build pins the +cpu wheel itself where the version is pinned (torch==2.13.0 ->
        # torch==2.13.0+cpu), so that an index without it answers "none" at once, not with
        # the CUDA wheel (about 1 GB) to be thrown away
        if [ "$flavour" = cpu ] && [[ "$torch_req" =~ ^torch==[0-9.]+$ ]]; then torch_req+="+cpu"; fi
        log "pip download $torch_req (no deps, $flavour) ..."
        local whl=""
        if "${pipcmd[@]}" --no-deps "$torch_req" >"$LOGS/wheels-$name.log" 2>&1; then
            whl=$(cd "$dir" && ls torch-*.whl)
        elif [ "$flavour" = cuda ]; then
            grep -v 'is ignored' "$LOGS/wheels-$name.log" | tail -n 20 >&2
            die "pip download $torch_req failed"
        fi
        if [ "$flavour" = cpu ] && [[ "$whl" != *+cpu* ]]; then
            log "torch: no +cpu wheel where pip is configured to look${whl:+ (it found $whl)}; asking $TORCH_CPU_INDEX ..."
            rm -f "$dir"/torch-*.whl
            pip_from_index download --progress-bar off -d "$dir" --index-url "$TORCH_CPU_INDEX" \
                --python-version "$pyver" "${PIP_PLATFORM_FLAGS[@]}" --no-deps "$torch_req" \
                >>"$LOGS/wheels-$name.log" 2>&1 \
                || { grep -v 'is ignored' "$LOGS/wheels-$name.log" | tail -n 20 >&2; rm -rf "$dir"; die "pip download $torch_req from $TORCH_CPU_INDEX failed: the CPU build needs torch's +cpu wheel (GPULAB_TORCH_CPU_INDEX names a mirror; --gpu cuda builds the CUDA image)"; }
            whl=$(cd "$dir" && ls torch-*.whl)
        fi
        log "torch resolved to $whl"
        if [ "$flavour" = cpu ] && [[ "$whl" != *+cpu* ]]; then
            rm -rf "$dir"
            die "torch resolved to $whl, not a +cpu build, for a CPU image (its CUDA dependencies are several GB): pin a version $TORCH_CPU_INDEX publishes, or build the CUDA image (--gpu cuda)"
        fi
        if [ "$flavour" = cuda ] && [[ "$whl" == *+cpu* ]]; then
            rm -rf "$dir"
            die "torch resolved to $whl, a CPU build, for a CUDA image: $WHEEL_INDEX must serve PyPI's torch"
        fi
    fi
    log "pip download -r ${req#"$ROOT"/} for cp$pyver manylinux x86_64 ($flavour) -> ${dir#"$ROOT"/} ..."
    # the torch wheel just downloaded is a candidate too (pip's index would offer the CUDA one)
    if [ -n "$torch_req" ]; then pipcmd+=(--find-links "$dir"); fi
    "${pipcmd[@]}" -r "$req" >>"$LOGS/wheels-$name.log" 2>&1 \
        || { grep -v 'is ignored' "$LOGS/wheels-$name.log" | tail -n 30 >&2; rm -rf "$dir"; die "pip download for $name failed (log: $LOGS/wheels-$name.log)"; }
    if [ "$flavour" = cuda ] && [ -z "$(cuda_of_wheels "$dir")" ]; then
        rm -rf "$dir"
        die "the CUDA wheels of $name hold no nvidia-cuda-runtime wheel: cannot tell the CUDA version they need"
    fi
    echo "$stamp" >"$dir/.stamp"
    log "downloaded $(ls "$dir"/*.whl | wc -l) wheels ($(du -sh "$dir" | cut -f1)) in $((SECONDS - t0)) s"
}

# requirements_of NAME FLAVOUR: the requirements file NAME is built from
# (images/NAME/requirements-cuda.txt for a CUDA build)
requirements_of() {
    if [ "$2" = cuda ]; then
        [ -f "$ROOT/images/$1/requirements-cuda.txt" ] || die "images/$1 has no requirements-cuda.txt"
        echo "$ROOT/images/$1/requirements-cuda.txt"
    else
        echo "$ROOT/images/$1/requirements.txt"
    fi
}

# files_hash DIR: names and contents of DIR/files/ (nothing when there is none, so that the
# hash of an image without one is what it was before files/ existed)
files_hash() {
    [ -d "$1/files" ] || return 0
    (cd "$1/files" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
}

# build_dockerfile NAME TAG BASE: build images/NAME/Dockerfile on BASE, unless TAG is current.
build_dockerfile() {
    local name=$1 tag=$2 base=$3 src=$ROOT/images/$1
    local flavour req hash
    flavour=$(flavour_of "$name")
    req=$(requirements_of "$name" "$flavour")
    # A CUDA image is never replaced by a CPU build the host's detection chose (a host whose
    # driver is not loaded now, a CI runner): only --gpu cpu replaces it.
    if [ "$flavour" = cpu ] && [ "$FLAVOUR_ASKED" = 0 ] && image_exists "$tag" \
        && [ "$(image_label "$tag" org.gpulab.flavour)" = cuda ]; then
        log "$tag: kept, it is a CUDA image (CUDA $(image_label "$tag" org.gpulab.cuda)) and this build would be CPU (no NVIDIA driver found on this host); --gpu cpu (make images GPU=cpu) replaces it with the CPU build, --gpu cuda rebuilds it"
        return
    fi
    hash=$( { cat "$src/Dockerfile" "$req"; files_hash "$src"; image_id "$base"; echo "${PIP_PLATFORM_FLAGS[*]}"; echo "${EXTRA_HASH:-}"
        if [ "$name" = python ]; then code_server_listing; fi
        if [ -n "$flavour" ]; then echo "flavour=$flavour"; fi; } | sha)
    if [ "$FORCE" = 0 ] && image_exists "$tag"; then
        local have
        have=$(image_label "$tag" org.gpulab.build-hash)
        if [ "$have" = "$hash" ]; then
            log "$tag: up to date"
            return
        fi
        log "$tag: exists but is stale (Dockerfile, requirements, flavour or base $base changed); rebuilding${flavour:+ as $flavour}"
    fi
    image_exists "$base" || log "base $base is not local: docker build will try to pull it"
    local t0=$SECONDS pyver glibc
    read -r pyver glibc <<<"$(base_python "$base" "$name")"
    [ -n "$pyver" ] || die "cannot tell the Python version of $base"
    download_wheels "$name" "$pyver" "${flavour:-cpu}" "$glibc"
    local wheels labels=()
    wheels=$(wheels_dir "$name" "${flavour:-cpu}")
    if [ -n "$flavour" ]; then labels+=(--label "org.gpulab.flavour=$flavour"); fi
    if [ "$flavour" = cuda ]; then labels+=(--label "org.gpulab.cuda=$(cuda_of_wheels "$wheels")"); fi

    local ctx=$BUILD/ctx/$name
    rm -rf "$ctx" && mkdir -p "$ctx"
    cp "$src/Dockerfile" "$ctx/"
    cp "$req" "$ctx/requirements.txt"
    # an image's own files (images/NAME/files/, e.g. the notebook server's configuration)
    if [ -d "$src/files" ]; then cp -a "$src/files" "$ctx/files"; fi
    # Hard links: no copy of the (large) wheels when .build is on one filesystem.
    cp -al "$wheels" "$ctx/wheels" 2>/dev/null || cp -a "$wheels" "$ctx/wheels"
    rm -f "$ctx/wheels/.stamp"
    # the python image carries code-server (VS Code), built on the host: hard links again
    if [ "$name" = python ]; then
        cp -al "$CODE_SERVER_DIR" "$ctx/code-server-dist" 2>/dev/null || cp -a "$CODE_SERVER_DIR" "$ctx/code-server-dist"
    fi
    # extra build context (the sync image's copy of gpulab's sync modules)
    if [ -n "${EXTRA_CONTEXT:-}" ]; then cp -a "$EXTRA_CONTEXT"/. "$ctx/"; fi

    log "docker build $tag (images/$name/Dockerfile, BASE_IMAGE=$base; log: ${LOGS#"$ROOT"/}/build-$name.log) ..."
    local cmd=(docker build --force-rm --build-arg "BASE_IMAGE=$base" --label "org.gpulab.build-hash=$hash"
        --label "org.gpulab.base-image=$base" "${labels[@]}" -t "$tag" "$ctx")
    local ok=1
    if [ "${GPULAB_BUILD_VERBOSE:-0}" = 1 ]; then
        DOCKER_BUILDKIT=0 "${cmd[@]}" 2>&1 | tee "$LOGS/build-$name.log" || ok=0
    else
        DOCKER_BUILDKIT=0 "${cmd[@]}" >"$LOGS/build-$name.log" 2>&1 || ok=0
    fi
    # The legacy builder leaves the builder stages (which hold the wheels) behind as untagged
    # images, and a failed step its intermediate images: remove them (their untagged parents go
    # with them; an image that still has children just fails to go, harmlessly).
    [ "${SIDE_BY_SIDE:-0}" = 1 ] || remove_builder_stages
    rm -rf "$ctx"
    if [ "$ok" = 0 ]; then
        tail -n 40 "$LOGS/build-$name.log" >&2
        die "docker build $tag failed (log above; full log: $LOGS/build-$name.log)"
    fi
    log "built $tag in $((SECONDS - t0)) s ($(docker image inspect --format '{{.Size}}' "$tag" | awk '{printf "%d MB", $1/1e6}'))"
}

# The builder stages of every image built, once no build runs (a build beside this one may
# still need its own).
remove_builder_stages() {
    docker images -a -q --filter "label=org.gpulab.stage=builder" | sort -u \
        | xargs -r docker rmi >/dev/null 2>&1 || true
}

# side_by_side NAME...: wait for the background builds started with `start NAME CMD...`;
# fails (after all have ended) naming each one that failed. Builds of images that do not
# depend on each other run side by side: they spend most of their time unpacking wheels and
# committing layers, so two cores finish three of them well before three in a row.
declare -A PIDS=()
start() {
    local name=$1
    shift
    ( SIDE_BY_SIDE=1 "$@" ) &
    PIDS[$name]=$!
}
side_by_side() {
    local name failed=()
    for name in "$@"; do
        [ -n "${PIDS[$name]:-}" ] || continue
        wait "${PIDS[$name]}" || failed+=("$name")
        unset "PIDS[$name]"
    done
    remove_builder_stages
    [ ${#failed[@]} = 0 ] || die "building ${failed[*]} failed (log above)"
}

# verify TAG PYTHON-CODE EXPECTED: the image runs as uid 1000 and the code prints EXPECTED*.
verify() {
    local tag=$1 code=$2 want=$3 out
    out=$(docker run --rm "$tag" sh -c "id -u; stat -c %u /workspace; pwd; python -c '$code'" 2>&1) \
        || { echo "$out" >&2; die "$tag: verification run failed"; }
    local uid owner cwd got
    { read -r uid; read -r owner; read -r cwd; got=$(tail -n 1); } <<<"$out"
    [ "$uid" = 1000 ] || die "$tag runs as uid '$uid', not 1000"
    [ "$owner" = 1000 ] || die "$tag: /workspace is owned by uid '$owner', not 1000"
    [ "$cwd" = /workspace ] || die "$tag: working directory is '$cwd', not /workspace"
    [[ "$got" == "$want"* ]] || { echo "$out" >&2; die "$tag: expected '$want', got '$got'"; }
    log "verified $tag: uid 1000, /workspace, $got"
}

# ---------------------------------------------------------------------------------------------
# code-server (VS Code) for the python image, built on the host once (scripts/build-code-server.sh)
CODE_SERVER_DIR=$BUILD/code-server
# what the python image's hash knows of it: its versions and every file's name, size and mode
# (a rebuild that changes a file changes the image; hashing 700 MB of content would cost more)
code_server_listing() {
    cat "$CODE_SERVER_DIR/.stamp"
    (cd "$CODE_SERVER_DIR" && find . -type f -printf '%P %s %m\n' | LC_ALL=C sort)
}

# The order of the builds: what depends on nothing first, side by side, then what needs it.
#   debian (debootstrap) | code-server (compiles on the host)
#   python (needs both)  | sync (needs debian)
#   pytorch | tensorflow | jax (need python)
NEED_DEBIAN=0
if [ -z "${BASE_IMAGE:-}" ] && selected debian && { [ "$FORCE" = 1 ] || ! image_exists "$DEBIAN_IMAGE"; }; then
    NEED_DEBIAN=1
    ensure_debootstrap # before code-server's apt-get starts (apt-install.sh takes turns anyway)
fi
selected python && start code-server "$ROOT/scripts/build-code-server.sh"
if [ -n "${BASE_IMAGE:-}" ]; then
    BASE=$BASE_IMAGE
    selected debian && log "BASE_IMAGE=$BASE_IMAGE: skipping the debootstrap image"
else
    BASE=$DEBIAN_IMAGE
    if [ "$NEED_DEBIAN" = 1 ]; then
        build_debian "$DEBIAN_IMAGE"
    elif selected debian; then
        log "$DEBIAN_IMAGE: exists"
    fi
fi
side_by_side code-server

# build_verified NAME TAG BASE CODE EXPECTED: build_dockerfile, then (when it built anything)
# verify that the image runs CODE as uid 1000 in /workspace and prints EXPECTED
build_verified() {
    local before
    before=$(image_id "$2")
    build_dockerfile "$1" "$2" "$3"
    [ "$(image_id "$2")" = "$before" ] && return
    verify "$2" "$4" "$5"
    [ "$(image_label "$2" org.gpulab.flavour)" != cuda ] || verify_cuda "$2"
}

# verify_cuda TAG: a CUDA image's own CUDA libraries load (no GPU or driver needed: libcudart,
# libcublas and libcudnn from its nvidia-* wheels, with ctypes), the runtime's version is the
# org.gpulab.cuda label's, and torch (where the image has it) was built for that CUDA.
verify_cuda() {
    local tag=$1 want got
    want=$(image_label "$tag" org.gpulab.cuda)
    got=$(docker run --rm -i "$tag" python - <<'EOF' 2>&1
import ctypes, glob, importlib.util, os, sys, sysconfig
nvidia = os.path.join(sysconfig.get_paths()["purelib"], "nvidia")
def load(pattern):
    found = sorted(glob.glob(os.path.join(nvidia, "**", pattern), recursive=True))
    if not found:
        sys.exit(f"no {pattern} under {nvidia}")
    return ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
cudart = load("libcudart.so.*")
load("libcublas.so.*")
load("libcudnn.so.*")
v = ctypes.c_int()
assert cudart.cudaRuntimeGetVersion(ctypes.byref(v)) == 0, "cudaRuntimeGetVersion failed"
runtime = f"{v.value // 1000}.{v.value % 1000 // 10}"
if importlib.util.find_spec("torch"):
    import torch
    assert torch.version.cuda and torch.version.cuda.startswith(runtime), (torch.version.cuda, runtime)
print(runtime)
EOF
) || { echo "$got" >&2; die "$tag: its CUDA libraries do not load"; }
    got=$(tail -n 1 <<<"$got")
    [ "$got" = "$want" ] || die "$tag: its CUDA runtime is $got, its label org.gpulab.cuda says $want"
    log "verified $tag: CUDA $got (libcudart, libcublas, libcudnn load)"
}

build_python() {
    build_verified python "$PYTHON_IMAGE" "$BASE" \
        'import sys, jupyterhub, jupyterlab, jupyter_server_proxy, jupyter_server.serverapp; print("slow start: the notebook server loads rfc3987_syntax (images/python/requirements.txt)" if "rfc3987_syntax" in sys.modules else "lean start:", "jupyterhub", jupyterhub.__version__, "jupyterlab", jupyterlab.__version__)' "lean start: jupyterhub 6.1.1"
    # VS Code runs in the image as the notebook user
    local cs
    cs=$(docker run --rm -e HOME=/tmp "$PYTHON_IMAGE" /opt/code-server/bin/node \
        /opt/code-server/lib/node_modules/code-server/out/node/entry.js --version 2>&1 | grep -E '^[0-9]' | head -1) \
        || die "$PYTHON_IMAGE: code-server does not run"
    [ -n "$cs" ] || die "$PYTHON_IMAGE: code-server --version printed nothing"
    log "verified $PYTHON_IMAGE: code-server $cs"
}

build_sync() {
    # gpulab's sync modules (stdlib + boto3 only) are copied in; their content is in the hash.
    # datasync/cli.py imports gpulab.volumes, which imports bounds and errors (stdlib only).
    # The GPU agent of a Swarm's nodes (gpus/agent.py: usage.py, inventory.py; stdlib and
    # nvidia-ml-py) runs from this image too
    local pkg=$BUILD/ctx-extra/sync before
    rm -rf "$pkg" && mkdir -p "$pkg/gpulab/datasync" "$pkg/gpulab/gpus"
    cp "$ROOT/src/gpulab/__init__.py" "$ROOT/src/gpulab/volumes.py" "$ROOT/src/gpulab/bounds.py" \
        "$ROOT/src/gpulab/errors.py" "$pkg/gpulab/"
    cp "$ROOT"/src/gpulab/datasync/*.py "$pkg/gpulab/datasync/"
    cp "$ROOT"/src/gpulab/gpus/{__init__,inventory,usage,agent}.py "$pkg/gpulab/gpus/"
    before=$(image_id "$SYNC_IMAGE")
    EXTRA_CONTEXT=$pkg EXTRA_HASH=$(cd "$pkg" && find . -type f | sort | xargs cat | sha) \
        build_dockerfile sync "$SYNC_IMAGE" "$BASE"
    rm -rf "$pkg"
    if [ "$(image_id "$SYNC_IMAGE")" != "$before" ]; then
        docker run --rm "$SYNC_IMAGE" --help >/dev/null || die "$SYNC_IMAGE: gpulab-sync --help failed"
        log "verified $SYNC_IMAGE: gpulab-sync runs"
    fi
}

selected python && start python build_python
selected sync && start sync build_sync
side_by_side python sync
selected pytorch && start pytorch build_verified pytorch "$PYTORCH_IMAGE" "$PYTHON_IMAGE" \
    'import numpy, torch; print(torch.__version__)' "2.13.0"
selected tensorflow && start tensorflow build_verified tensorflow "$TENSORFLOW_IMAGE" "$PYTHON_IMAGE" \
    'import tensorflow as tf; print(tf.__version__)' "2.20"
selected jax && start jax build_verified jax "$JAX_IMAGE" "$PYTHON_IMAGE" \
    'import jax; print(jax.__version__)' "0.7"
side_by_side pytorch tensorflow jax

if selected proxy; then
    # the host's node binary (it needs only libc and libstdc++) and the configurable-http-proxy
    # that `make proxy` installed; their content is in the hash
    chp=$BUILD/node/node_modules
    [ -x "$chp/.bin/configurable-http-proxy" ] || die "configurable-http-proxy is not installed: make proxy"
    node=$(readlink -f "$(command -v node)") || die "node is not on the PATH"
    pkg=$BUILD/ctx-extra/proxy
    rm -rf "$pkg" && mkdir -p "$pkg"
    cp "$node" "$pkg/node"
    cp -a "$chp" "$pkg/node_modules"
    PROXY_HASH=$( { cat "$ROOT/images/proxy/Dockerfile"; sha256sum "$pkg/node"; (cd "$pkg" && find node_modules -type f -print0 | sort -z | xargs -0 cat); image_id "$BASE"; } | sha)
    if [ "$FORCE" = 0 ] && image_exists "$PROXY_IMAGE" \
        && [ "$(image_label "$PROXY_IMAGE" org.gpulab.build-hash)" = "$PROXY_HASH" ]; then
        log "$PROXY_IMAGE: up to date"
    else
        cp "$ROOT/images/proxy/Dockerfile" "$pkg/"
        t0=$SECONDS
        DOCKER_BUILDKIT=0 docker build --force-rm --build-arg "BASE_IMAGE=$BASE" \
            --label "org.gpulab.build-hash=$PROXY_HASH" -t "$PROXY_IMAGE" "$pkg" \
            >"$LOGS/build-proxy.log" 2>&1 \
            || { tail -n 40 "$LOGS/build-proxy.log" >&2; die "docker build $PROXY_IMAGE failed"; }
        log "built $PROXY_IMAGE in $((SECONDS - t0)) s"
    fi
    rm -rf "$pkg"
fi

built=$(for s in "${SELECTED[@]}"; do case $s in debian) [ -n "${BASE_IMAGE:-}" ] || printf '%s ' "$DEBIAN_IMAGE" ;; python) printf '%s ' "$PYTHON_IMAGE" ;; pytorch) printf '%s ' "$PYTORCH_IMAGE" ;; sync) printf '%s ' "$SYNC_IMAGE" ;; proxy) printf '%s ' "$PROXY_IMAGE" ;; tensorflow) printf '%s ' "$TENSORFLOW_IMAGE" ;; jax) printf '%s ' "$JAX_IMAGE" ;; esac; done)
log "done: $built"

# --push: the same images under the registry's name, pushed (layers the registry has are skipped)
if [ -n "$PUSH" ]; then
    t0=$SECONDS
    for img in $built; do
        docker tag "$img" "$PUSH/$img"
        docker push -q "$PUSH/$img" >"$LOGS/push.log" 2>&1 \
            || { cat "$LOGS/push.log" >&2; die "docker push $PUSH/$img failed (is $PUSH a registry this engine trusts?)"; }
        log "pushed $PUSH/$img"
    done
    log "pushed $(wc -w <<<"$built") image(s) to $PUSH in $((SECONDS - t0)) s"
fi
