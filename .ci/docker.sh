#!/usr/bin/env bash
# Docker for tests and demos: a rootful AND a rootless daemon on one host, both holding the
# docbroker images. Idempotent: every step checks first, so re-running is cheap and safe.
#
#   bash .ci/docker.sh            (as root; Debian 12)
#   source .ci/docker.env         → DOCBROKER_TEST_DOCKER_HOSTS, DOCKER_HOST_ROOTFUL, DOCKER_HOST_ROOTLESS
#
# Env: PYTHON (a Python with the docker SDK; default .venv/bin/python, then python3),
#      DOCBROKER_ROOTLESS_USER (default docbroker), DOCBROKER_SKIP_ROOTLESS=1 (rootful only).
# Logs: /var/log/docbroker-dockerd-rootful.log, /var/log/docbroker-dockerd-rootless.log.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi
RL_USER=${DOCBROKER_ROOTLESS_USER:-docbroker}
ROOTFUL_SOCK=/var/run/docker.sock
ROOTFUL_HOST=unix://$ROOTFUL_SOCK
ENV_FILE=$ROOT/.ci/docker.env
IMAGES=(docbroker-server:latest)

step() { printf '\033[1m--> %s\033[0m\n' "$*" >&2; }
die() { echo "docker.sh: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root"

wait_socket() {  # wait_socket HOST SECONDS LOG
  local host=$1 seconds=$2 log=$3 i
  for ((i = 0; i < seconds * 2; i++)); do
    if DOCKER_HOST=$host docker version >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  tail -n 40 "$log" >&2 || true
  die "daemon at $host did not answer within ${seconds}s"
}

install_packages() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v rootlesskit >/dev/null || missing+=(rootlesskit)
  command -v slirp4netns >/dev/null || missing+=(slirp4netns)
  command -v newuidmap >/dev/null || missing+=(uidmap)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  # ss: the reliability run (tests/reliability) sees requests waiting in a sandbox's sockets.
  command -v ss >/dev/null || missing+=(iproute2)
  [ -e /usr/share/docker.io/contrib/dockerd-rootless.sh ] || missing+=(docker.io)
  if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
  fi
}

start_rootful() {
  if DOCKER_HOST=$ROOTFUL_HOST docker version >/dev/null 2>&1; then
    step "rootful dockerd: running"
    return
  fi
  step "starting the rootful dockerd"
  local log=/var/log/docbroker-dockerd-rootful.log
  nohup dockerd >"$log" 2>&1 </dev/null &
  wait_socket "$ROOTFUL_HOST" 60 "$log"
}

rootless_dirs() {
  RL_UID=$(id -u "$RL_USER")
  RL_HOME=$(getent passwd "$RL_USER" | cut -d: -f6)
  RL_RUNTIME=$RL_HOME/.docker-run
  ROOTLESS_HOST=unix://$RL_RUNTIME/docker.sock
}

start_rootless() {
  if ! id "$RL_USER" >/dev/null 2>&1; then
    step "creating the unprivileged user $RL_USER"
    useradd -m -s /bin/bash "$RL_USER"
  fi
  grep -q "^$RL_USER:" /etc/subuid || usermod --add-subuids 200000-265535 "$RL_USER"
  grep -q "^$RL_USER:" /etc/subgid || usermod --add-subgids 200000-265535 "$RL_USER"
  rootless_dirs
  if DOCKER_HOST=$ROOTLESS_HOST docker version >/dev/null 2>&1; then
    step "rootless dockerd ($RL_USER): running"
    return
  fi
  step "starting the rootless dockerd as $RL_USER"
  [ -e /dev/net/tun ] || { mkdir -p /dev/net && mknod /dev/net/tun c 10 200; }
  chmod 666 /dev/net/tun
  # A private XDG_RUNTIME_DIR (there is no systemd --user session here); 0700 as rootlesskit wants.
  install -d -m 700 -o "$RL_USER" -g "$(id -g "$RL_USER")" "$RL_RUNTIME"
  rm -f "$RL_RUNTIME/docker.sock" "$RL_RUNTIME/docker.pid"
  rm -rf "$RL_RUNTIME/dockerd-rootless" "$RL_RUNTIME/docker"
  local log=/var/log/docbroker-dockerd-rootless.log
  : >"$log"
  chown "$RL_USER" "$log"
  # setsid + nohup: the daemon outlives this script; runuser keeps no controlling terminal.
  setsid runuser -u "$RL_USER" -- env -i HOME="$RL_HOME" USER="$RL_USER" \
    XDG_RUNTIME_DIR="$RL_RUNTIME" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    nohup sh /usr/share/docker.io/contrib/dockerd-rootless.sh >>"$log" 2>&1 </dev/null &
  wait_socket "$ROOTLESS_HOST" 90 "$log"
}

build_images() {
  step "building the images in the rootful daemon (base: debootstrap, cached)"
  (cd "$ROOT" && DOCKER_HOST=$ROOTFUL_HOST "$PY" -m broker.cli.build_images server broker)
}

copy_images_to_rootless() {
  local image id_rootful id_rootless
  for image in "${IMAGES[@]}"; do
    id_rootful=$(DOCKER_HOST=$ROOTFUL_HOST docker image inspect -f '{{.Id}}' "$image")
    id_rootless=$(DOCKER_HOST=$ROOTLESS_HOST docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
    if [ "$id_rootful" = "$id_rootless" ]; then
      step "rootless daemon: $image is up to date"
      continue
    fi
    step "rootless daemon: loading $image (docker save | docker load)"
    DOCKER_HOST=$ROOTFUL_HOST docker save "$image" | DOCKER_HOST=$ROOTLESS_HOST docker load -q
  done
}

write_env() {
  local hosts=$ROOTFUL_HOST
  {
    echo "# written by .ci/docker.sh: the daemons the Docker tests run against"
    echo "export DOCKER_HOST_ROOTFUL=$ROOTFUL_HOST"
    if [ -n "${ROOTLESS_HOST:-}" ]; then
      echo "export DOCKER_HOST_ROOTLESS=$ROOTLESS_HOST"
      hosts="$hosts,$ROOTLESS_HOST"
    fi
    echo "export DOCBROKER_TEST_DOCKER_HOSTS=$hosts"
  } >"$ENV_FILE"
  step "daemons: $hosts (written to ${ENV_FILE#"$ROOT"/})"
  echo "DOCKER_HOST_ROOTFUL=$ROOTFUL_HOST"
  [ -z "${ROOTLESS_HOST:-}" ] || echo "DOCKER_HOST_ROOTLESS=$ROOTLESS_HOST"
}

install_packages
start_rootful
build_images
if [ "${DOCBROKER_SKIP_ROOTLESS:-0}" != 1 ]; then
  start_rootless
  copy_images_to_rootless
fi
write_env
