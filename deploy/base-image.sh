#!/bin/sh
# Build the local base image docbroker-base:bookworm from Debian packages only.
#
# Why: these hosts (and air-gapped users) cannot pull `python:3.11-slim` from a registry, but
# they can reach Debian's mirrors. debootstrap gives the same Debian Python the slim images
# are built from. The result is cached: nothing is done when the image already exists
# (FORCE=1 rebuilds it).
#
# What is removed, and why:
#   - apt, dpkg, debconf, perl: no package manager is usable inside a sandbox at run time, so a
#     compromised server cannot install tools (the root fs is read-only too: defence in depth);
#     dpkg's status file alone stays (var/lib/dpkg/status, where scanners look): it is the
#     list of Debian packages the image's SBOM names (docs/supply-chain.md);
#   - docs, man pages, locales, apt lists and caches, logs: bytes the server never reads;
#   - stdlib test suites, idle, tkinter, lib2to3, turtle demos: never imported by the server.
# The shell (dash) stays in the base because `RUN` steps of the Dockerfiles need it; the server
# image removes shells in its last step (deploy/prune.py).
#
# Usage: deploy/base-image.sh [IMAGE]     env: FORCE=1, SUITE=bookworm, MIRROR=<url>, DOCKER=docker
set -eu

IMAGE="${1:-docbroker-base:bookworm}"
# What this script leaves in the base; broker/images.py (BASE_LAYOUT) rebuilds an older one.
# 2: dpkg's status file is kept for the SBOM.
LAYOUT=2
SUITE="${SUITE:-bookworm}"
DOCKER="${DOCKER:-docker}"

if [ "${FORCE:-0}" != 1 ] && $DOCKER image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "base image $IMAGE exists (FORCE=1 rebuilds it)"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install -y debootstrap" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "debootstrap needs root" >&2; exit 1; }

ROOTFS="$(mktemp -d /var/tmp/docbroker-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT INT TERM

echo "debootstrap $SUITE into $ROOTFS (about a minute)"
# shellcheck disable=SC2086 # MIRROR is optional: debootstrap's default mirror when unset
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$ROOTFS" ${MIRROR:-} >"$ROOTFS.log" 2>&1 || {
    tail -n 30 "$ROOTFS.log" >&2
    exit 1
}
rm -f "$ROOTFS.log"

echo "precompiling the standard library (the sandbox's root fs is read-only: no pyc cache at run time)"
PYVER="$(chroot "$ROOTFS" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
chroot "$ROOTFS" python3 -m compileall -q -j 0 -x '/(test|idlelib|tkinter|lib2to3|turtledemo)/' \
    "/usr/lib/python$PYVER" >/dev/null || true

echo "stripping the root fs"
cd "$ROOTFS"
rm -rf \
    usr/share/doc/* usr/share/man/* usr/share/info/* usr/share/locale/* usr/share/i18n \
    usr/share/lintian usr/share/linda usr/share/common-licenses usr/share/bash-completion \
    usr/share/zsh usr/share/perl5 usr/share/debconf usr/share/bug usr/share/menu \
    usr/lib/*-linux-gnu/perl-base usr/lib/*-linux-gnu/perl usr/bin/perl* \
    usr/lib/locale/* usr/lib/*-linux-gnu/gconv \
    var/cache/* var/lib/apt var/cache/debconf var/log/* \
    etc/apt etc/dpkg usr/share/dpkg usr/lib/dpkg usr/lib/apt \
    usr/bin/apt* usr/bin/dpkg* usr/sbin/dpkg* usr/bin/debconf* usr/sbin/update-* \
    usr/bin/su usr/bin/passwd usr/bin/chsh usr/bin/chfn usr/bin/newgrp usr/bin/gpasswd \
    usr/bin/mount usr/bin/umount usr/sbin/unix_chkpwd \
    usr/lib/*-linux-gnu/libapt-* usr/sbin/*fsck* usr/sbin/debugfs usr/sbin/mke2fs usr/sbin/mkfs* \
    usr/bin/gpgv usr/bin/localedef usr/bin/openssl \
    "usr/lib/python$PYVER/test" "usr/lib/python$PYVER/idlelib" "usr/lib/python$PYVER/tkinter" \
    "usr/lib/python$PYVER/lib2to3" "usr/lib/python$PYVER/turtledemo" "usr/lib/python$PYVER/pydoc_data" \
    usr/lib/python3/dist-packages/*/tests \
    tmp/* run/* root/.cache dev/* proc/* sys/*
find var/lib/dpkg -mindepth 1 -maxdepth 1 ! -name status -exec rm -rf {} +
# No setuid/setgid binary is left: no-new-privileges makes them inert anyway, but there is no
# reason to ship any.
find . -xdev -type f -perm /6000 -exec chmod ug-s {} + 2>/dev/null || true
cd - >/dev/null

echo "importing $IMAGE"
tar --numeric-owner -C "$ROOTFS" -c . | $DOCKER import \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8' \
    --change 'CMD ["python3"]' --change "LABEL io.docbroker.base-layout=$LAYOUT" - "$IMAGE" >/dev/null
$DOCKER image inspect "$IMAGE" --format "$IMAGE: {{.Size}} bytes"
