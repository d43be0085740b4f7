#!/usr/bin/env bash
# A throw-away PostgreSQL cluster for the tests: Debian's server, a data dir of its own, a unix
# socket only (no TCP port, nothing reachable from outside), trust auth inside it, stopped and
# removed at the end. Idempotent install; the cluster itself is always new.
#
#   bash .ci/postgres.sh start DIR   → DIR/env holds DOCBROKER_TEST_DATABASE_URL
#   bash .ci/postgres.sh stop DIR    (stops the server and removes DIR)
#
# initdb refuses to run as root: the cluster belongs to an unprivileged user
# (DOCBROKER_PG_USER, default docbroker; created if missing). Log: DIR/postgres.log.
set -euo pipefail

PG_USER=${DOCBROKER_PG_USER:-docbroker}
step() { printf '\033[1m--> %s\033[0m\n' "$*" >&2; }
die() { echo "postgres.sh: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root"
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: postgres.sh start|stop DIR"
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac  # as_user runs from /

pg_bin() {
  local found
  found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$found" ] && [ -x "$found/initdb" ] && echo "$found"
}

# From /: the checkout may sit where that user cannot enter (a mktemp folder, /root), and psql
# says so ("could not change directory") on every call.
as_user() { (cd / && runuser -u "$PG_USER" -- "$@"); }

start() {
  local bin
  bin=$(pg_bin || true)
  if [ -z "$bin" ]; then
    step "installing PostgreSQL (Debian's postgresql package)"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
    # The package starts a cluster of its own; the tests never use it.
    pg_ctlcluster --help >/dev/null 2>&1 && for c in $(pg_lsclusters -h 2>/dev/null | awk '{print $1"/"$2}'); do
      pg_ctlcluster "${c%/*}" "${c#*/}" stop || true
    done
    bin=$(pg_bin) || die "initdb not found after installing postgresql"
  fi
  id "$PG_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$PG_USER"
  rm -rf "$dir"
  install -d -m 755 "$dir"
  install -d -m 700 -o "$PG_USER" "$dir/data"
  install -d -m 755 -o "$PG_USER" "$dir/socket"
  step "PostgreSQL: a throw-away cluster in $dir (unix socket only)"
  as_user "$bin/initdb" -D "$dir/data" --auth=trust --username=docbroker --encoding=UTF8 --no-locale \
    >"$dir/initdb.log" 2>&1 || { tail -n 30 "$dir/initdb.log" >&2; die "initdb failed"; }
  touch "$dir/postgres.log" && chown "$PG_USER" "$dir/postgres.log"
  as_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
    -o "-k $dir/socket -h '' -c fsync=off -c max_connections=200" start >/dev/null \
    || { tail -n 30 "$dir/postgres.log" >&2; die "PostgreSQL did not start"; }
  as_user "$bin/createdb" -h "$dir/socket" -U docbroker docbroker_test
  echo "DOCBROKER_TEST_DATABASE_URL=postgresql://docbroker@/docbroker_test?host=$dir/socket" >"$dir/env"
  echo "DOCBROKER_TEST_PG_BIN=$bin" >>"$dir/env"
  echo "DOCBROKER_TEST_PG_DATA=$dir/data" >>"$dir/env"
}

stop() {
  local bin
  bin=$(pg_bin || true)
  if [ -n "$bin" ] && [ -d "$dir/data" ]; then
    as_user "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) die "usage: postgres.sh start|stop DIR" ;;
esac
