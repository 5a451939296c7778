#!/usr/bin/env bash
# A real container engine and a local base image on a fresh machine, for the compose tests.
#   bash scripts/containers.sh prepare   # engine, base image, wheelhouse, vflnet-pybase image
#   bash scripts/containers.sh stop      # stops the dockerd that `prepare` started (if it did)
#
# No image registry is reachable from the machines we test on, so the public python:3.11-slim
# base cannot be pulled. `prepare` makes a stand-in locally and caches every step:
#   1. apt: docker.io, docker-compose (v1), debootstrap            (skipped when installed)
#   2. dockerd, started as root with its defaults                   (skipped when one answers)
#   3. vflnet-debian:bookworm: debootstrap --variant=minbase of bookworm from the mirror apt is
#      configured with (its python3 is 3.11), then `docker import`  (skipped when the image exists)
#   4. a wheelhouse: `pip download` of the project's requirements at the versions of .venv, with
#      this machine's pip configuration                             (pip skips files it has)
#   5. vflnet-pybase:py3.11: a venv on PATH plus the wheelhouse, PIP_NO_INDEX/PIP_FIND_LINKS set,
#      so deploy/Dockerfile builds on it unchanged with --build-arg BASE=vflnet-pybase:py3.11
# It prints the base image's name last, on a line of its own.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${VFLNET_CONTAINER_CACHE:-/var/cache/vflnet-containers}
STATE=$CACHE/state
DEBIAN_IMAGE=vflnet-debian:bookworm
BASE_IMAGE=vflnet-pybase:py3.11
VENV_PYTHON=${VENV_PYTHON:-.venv/bin/python}

say() { echo "containers: $*" >&2; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    say "must run as root (apt, dockerd, debootstrap); run it with sudo"
    exit 1
  fi
}

install_packages() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    say "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

start_engine() {
  if engine_answers; then
    return
  fi
  mkdir -p "$STATE"
  say "starting dockerd (log: $STATE/dockerd.log)"
  # setsid: the daemon outlives this script; `stop` ends it by the PID written here.
  setsid dockerd >"$STATE/dockerd.log" 2>&1 </dev/null &
  echo $! >"$STATE/dockerd.pid"
  for _ in $(seq 1 120); do
    engine_answers && return
    kill -0 "$(cat "$STATE/dockerd.pid")" 2>/dev/null || break
    sleep 1
  done
  say "dockerd did not come up; the end of its log:"
  tail -20 "$STATE/dockerd.log" >&2
  exit 1
}

stop_engine() {
  local pidfile=$STATE/dockerd.pid
  [ -f "$pidfile" ] || { say "no dockerd started by this script"; return; }
  local pid
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    say "stopped dockerd (pid $pid)"
  fi
  rm -f "$pidfile"
}

# The first deb mirror in apt's configuration (deb822 .sources or one-line .list files).
apt_mirror() {
  local uri
  uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -m1 '/debian/\?$' || true)
  [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
    | awk '{print $2}' | grep -m1 '/debian/\?$' || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

debian_image() {
  image_exists "$DEBIAN_IMAGE" && return
  local tarball=$CACHE/bookworm-minbase.tar
  if [ ! -s "$tarball" ]; then
    local root=$CACHE/rootfs mirror
    mirror=$(apt_mirror)
    rm -rf "$root"
    mkdir -p "$root"
    say "debootstrap bookworm from $mirror (a few minutes)"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      bookworm "$root" "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  say "docker import $DEBIAN_IMAGE"
  docker import "$tarball" "$DEBIAN_IMAGE" >/dev/null
}

# The project's runtime requirements (and its build backend) at the versions installed in .venv,
# so the containers compute what `vflnet run` computes here.
wheelhouse() {
  local wheels=$CACHE/wheels reqs constraints
  mkdir -p "$wheels"
  reqs=$(mktemp)
  constraints=$(mktemp)
  "$VENV_PYTHON" - "$reqs" <<'EOF'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
lines = project["project"]["dependencies"] + project["build-system"]["requires"] + ["wheel"]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF
  "$VENV_PYTHON" -m pip freeze --exclude-editable >"$constraints"
  # Skipped when the requirements and the versions asked for are those of the last download.
  local stamp
  stamp=$(cat "$reqs" "$constraints" | sha256sum | cut -c1-16)
  if [ "$(cat "$CACHE/wheels.stamp" 2>/dev/null)" = "$stamp" ]; then
    rm -f "$reqs" "$constraints"
    return
  fi
  say "pip download into $wheels"
  "$VENV_PYTHON" -m pip download -q -d "$wheels" -r "$reqs" -c "$constraints" >"$CACHE/pip-download.log" 2>&1 \
    || { grep -v '^WARNING: Location' "$CACHE/pip-download.log" | tail -20 >&2; exit 1; }
  rm -f "$reqs" "$constraints"
  echo "$stamp" >"$CACHE/wheels.stamp"
}

pybase_image() {
  # Rebuilt only when the wheelhouse changed: the image carries a digest of the wheel file names.
  local ctx=$CACHE/pybase digest
  digest=$(ls "$CACHE/wheels" | sha256sum | cut -c1-16)
  if [ "$(docker image inspect -f '{{ index .Config.Labels "vflnet.wheels" }}' "$BASE_IMAGE" 2>/dev/null)" = "$digest" ]; then
    return
  fi
  rm -rf "$ctx"
  mkdir -p "$ctx"
  ln "$CACHE"/wheels/* "$ctx"/ 2>/dev/null || cp "$CACHE"/wheels/* "$ctx"/
  cat >"$ctx/Dockerfile" <<EOF
FROM $DEBIAN_IMAGE
COPY . /wheels
RUN rm /wheels/Dockerfile && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:\$PATH \\
    PIP_NO_INDEX=1 \\
    PIP_FIND_LINKS=/wheels \\
    LANG=C.UTF-8
LABEL vflnet.wheels=$digest
CMD ["python"]
EOF
  say "docker build $BASE_IMAGE"
  docker build -q -t "$BASE_IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
}

case "${1:-}" in
  prepare)
    need_root
    mkdir -p "$CACHE"
    install_packages
    start_engine
    debian_image
    wheelhouse
    pybase_image
    echo "$BASE_IMAGE"
    ;;
  stop)
    stop_engine
    ;;
  *)
    echo "usage: $0 prepare|stop" >&2
    exit 2
    ;;
esac
