#!/usr/bin/env bash
# Makes a Docker engine answer on this machine, for tests/containers.rs (its Docker test
# imports a root file system made locally as an image: no registry is ever contacted).
# Called by .ci/run; usable by hand. Idempotent: when `docker info` answers already it
# returns at once (a fraction of a second).
#
#   1. Installs Debian's docker.io (dockerd, containerd, runc, the client) when dockerd is
#      missing (apt-get).
#   2. Starts dockerd in the background when no engine answers, logging to $LOG. Storage
#      driver: overlay2 where /var/lib/docker's file system can carry it, vfs where it
#      cannot (overlay on overlay); SCALENE_RS_DOCKER_STORAGE overrides the choice.
#   3. Waits up to $SCALENE_RS_DOCKER_WAIT seconds (default 60) for `docker info` to answer,
#      else fails with the daemon's last log lines.
#
# Needs root. The tests run their containers with `--network none`: no bridge or NAT is
# needed, so dockerd is started without iptables rules.
set -euo pipefail

LOG="${SCALENE_RS_DOCKER_LOG:-/var/log/scalene-rs-dockerd.log}"
WAIT="${SCALENE_RS_DOCKER_WAIT:-60}"

log() { printf '[docker] %s\n' "$*" >&2; }
die() { printf 'tools/docker.sh: %s\n' "$*" >&2; exit 1; }

if docker info >/dev/null 2>&1; then
    log "engine answers already ($(docker info --format '{{.ServerVersion}} {{.Driver}}' 2>/dev/null))"
    exit 0
fi
[ "$(id -u)" = 0 ] || die "no Docker engine answers, and starting one needs root"

if ! command -v dockerd >/dev/null 2>&1; then
    log "installing Debian's docker.io"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null \
        || die "apt-get install docker.io failed"
fi
command -v dockerd >/dev/null 2>&1 || die "docker.io is installed but there is no dockerd"
command -v docker >/dev/null 2>&1 || die "docker.io is installed but there is no docker client"

if pgrep -x dockerd >/dev/null 2>&1; then
    # Started by someone else (or a previous run) and not answering yet: wait for it below
    # rather than start a second daemon on the same socket.
    log "dockerd runs (pid $(pgrep -x dockerd | tr '\n' ' ')) but does not answer yet"
else
    mkdir -p /var/lib/docker
    driver="${SCALENE_RS_DOCKER_STORAGE:-}"
    if [ -z "$driver" ]; then
        fs=$(stat -f -c %T /var/lib/docker)
        if grep -qw overlay /proc/filesystems && [ "$fs" != overlayfs ]; then
            driver=overlay2
        else
            driver=vfs
        fi
    fi
    log "starting dockerd (storage driver $driver, log $LOG)"
    setsid dockerd --storage-driver="$driver" --iptables=false --ip-masq=false \
        </dev/null >>"$LOG" 2>&1 &
fi

for _ in $(seq "$((WAIT * 4))"); do
    if docker info >/dev/null 2>&1; then
        log "engine answers ($(docker info --format '{{.ServerVersion}} {{.Driver}}'))"
        exit 0
    fi
    sleep 0.25
done
tail -20 "$LOG" >&2 2>/dev/null || true
die "no answer from \`docker info\` after ${WAIT}s (dockerd log: $LOG)"
