#!/usr/bin/env bash
# A local PostgreSQL server for the tests that check gpulab on PostgreSQL (idempotent, fast when
# it runs). Debian's postgresql is installed if missing; the cluster is started without systemd
# and a superuser role for the current OS user is created (peer authentication on the socket).
set -euo pipefail
log() { printf '[ensure-postgres] %s\n' "$*" >&2; }

if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    log "installing Debian's postgresql"
    "$(dirname "$0")/apt-install.sh" --log /tmp/gpulab-apt-postgres.log postgresql
fi
version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
[ -n "$version" ] || { log "no PostgreSQL cluster found in /etc/postgresql"; exit 1; }
if ! pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $4}' | grep -q online; then
    log "starting cluster $version/main"
    pg_ctlcluster "$version" main start
fi
for _ in $(seq 1 30); do
    su postgres -c "psql -qAtc 'select 1'" >/dev/null 2>&1 && break
    sleep 0.5
done
me=$(id -un)
if ! su postgres -c "psql -qAtc \"select 1 from pg_roles where rolname = '$me'\"" | grep -q 1; then
    su postgres -c "createuser --superuser $me"
fi
log "PostgreSQL $version is up (socket /var/run/postgresql, role $me)"
