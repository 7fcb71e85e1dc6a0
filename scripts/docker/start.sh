#!/usr/bin/env bash
# Start a private Docker daemon on this machine, for sweep's end-to-end tests of the torchx
# launcher's `local_docker` scheduler. It coexists with any other dockerd (the system's, a
# developer's): its own data and exec roots, socket, pid file, containerd and containerd
# namespaces, default bridge and address pool.
#
#   sudo scripts/docker/start.sh           # last line: DOCKER_HOST=unix:///tmp/sweep-docker/docker.sock
#   sudo scripts/docker/stop.sh [--purge]  # stop it (--purge: delete images, containers, everything)
#
# Debian 12: `docker.io` is installed with apt when `dockerd` is missing. Needs root (it starts
# dockerd, which creates bridges and network namespaces).
#
# Idempotent: run again, it reuses the running daemon of the same base (well under a second).
#
# Networking, chosen to leave the machine as it was:
#   --bridge=swd<hash>       a default bridge of its own, made here and deleted by stop.sh: not
#                            docker0, which another daemon may own. (Not --bridge=none: dockerd
#                            20.10 then deletes any link named docker0 at start, another
#                            daemon's included.) torchx puts its containers on a user-defined
#                            bridge network (`torchx`) anyway.
#   --default-address-pool   the default bridge and user-defined networks get /24s of
#                            $DOCKER_ADDRESS_POOL, a private range unlikely to clash with a
#                            site's or another daemon's (172.17+)
#   --iptables=false --ip-masq=false --ip-forward=false
#                            docker writes no iptables rule and changes no sysctl (a daemon that
#                            does sets the FORWARD policy to DROP and adds chains no stop removes).
#                            Containers on one bridge talk to each other at layer 2 and need no
#                            forwarding; they reach no outside network (the tests need none).
#   one iptables rule of our own: with br_netfilter (bridge-nf-call-iptables=1), frames crossing
#                            a bridge traverse the FORWARD chain, so a FORWARD policy of DROP (set
#                            by another daemon) would drop container-to-container traffic. We
#                            insert `-s POOL -d POOL -j ACCEPT`, marked with a comment naming this
#                            base, first in FORWARD; stop.sh deletes exactly that rule.
#
# What lives where ($DOCKER_BASE):
#   docker.sock       the API (DOCKER_HOST=unix://$DOCKER_BASE/docker.sock)
#   dockerd.pid       stop.sh stops exactly this process (and what it started)
#   dockerd.log       the daemon's log (and its containerd's)
#   data/ exec/       --data-root (images, containers) and --exec-root (containerd, netns)
#   iptables.before   `iptables-save` at the first start: stop.sh checks the rules are back to it
#   apt.log           the package install, if one was needed
#
# Knobs (environment variables):
#   DOCKER_BASE          where everything above lives (default /tmp/sweep-test-docker; at most 60
#                        characters: containerd's unix socket paths under it must stay short)
#   DOCKER_ADDRESS_POOL  the pool of the user-defined networks (default 10.213.0.0/16)
#   DOCKER_WAIT_S        seconds to wait for the daemon to answer (default 60)
set -euo pipefail

die() { echo "scripts/docker/start.sh: ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (it installs docker.io and starts dockerd); run it with
sudo, or skip the Docker tests with: pytest -m 'not docker'"

BASE=${DOCKER_BASE:-/tmp/sweep-test-docker}
POOL=${DOCKER_ADDRESS_POOL:-10.213.0.0/16}
WAIT_S=${DOCKER_WAIT_S:-60}
case "$BASE" in /*) ;; *) die "DOCKER_BASE must be an absolute path, not '$BASE'" ;; esac
BASE=${BASE%/}
[ ${#BASE} -le 60 ] || die "DOCKER_BASE must be at most 60 characters (unix socket paths under it), not '$BASE'"
[[ "$POOL" =~ ^([0-9]{1,3}\.){3}[0-9]{1,3}/(8|9|1[0-9]|2[0-4])$ ]] \
  || die "DOCKER_ADDRESS_POOL must be an IPv4 network of prefix /8 to /24, such as 10.213.0.0/16, not '$POOL'"
[[ "$WAIT_S" =~ ^[1-9][0-9]*$ ]] || die "DOCKER_WAIT_S must be a positive integer, not '$WAIT_S'"
SOCK=$BASE/docker.sock LOG=$BASE/dockerd.log PIDFILE=$BASE/dockerd.pid
# containerd namespaces of their own (another daemon on the same containerd must not see our
# containers): named after the base, so that two bases never share one
TAG=$(printf '%s' "$BASE" | sha256sum | cut -c1-8)
NS=sweep-$TAG
BRIDGE=swd$TAG   # at most 15 characters (a Linux interface name)
# the rule stop.sh deletes: the comment names the base
RULE=(FORWARD -s "$POOL" -d "$POOL" -m comment --comment "sweep-test-docker $BASE" -j ACCEPT)

T0=$(date +%s%N)
say() { printf '[docker start %5.1fs] %s\n' "$(( ($(date +%s%N) - T0) / 1000000 ))e-3" "$*"; }
alive() { local p; p=$(cat "$1" 2>/dev/null) || return 1; [ -n "$p" ] && [ -r "/proc/$p/comm" ] && [[ "$(cat "/proc/$p/comm")" == "$2"* ]]; }
answers() { timeout 10 docker -H "unix://$SOCK" info >/dev/null 2>&1; }
ensure_rule() {
  iptables -w 10 -C "${RULE[@]}" 2>/dev/null && return 0
  iptables -w 10 -I "${RULE[@]:0:1}" 1 "${RULE[@]:1}" || die "could not insert the iptables rule '${RULE[*]}'"
  say "iptables: containers of $POOL may talk to each other (FORWARD rule 1, removed by stop.sh)"
}

mkdir -p "$BASE"

# ------------------------------------------------------------------ 1. packages
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v iptables >/dev/null || missing+=(iptables)
command -v ip >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
  say "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # docker.io's maintainer scripts would start the system's dockerd; we start our own.
  # policy-rc.d exit 101 = "do not start services", only for the install.
  POLICY=/usr/sbin/policy-rc.d; OUR_POLICY=0
  if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# temporary, from sweep scripts/docker/start.sh\nexit 101\n' >"$POLICY"
    chmod 0755 "$POLICY"; OUR_POLICY=1
    trap '[ "$OUR_POLICY" = 1 ] && rm -f "$POLICY"' EXIT
  fi
  apt_install() { apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$BASE/apt.log" 2>&1; }
  if ! apt_install; then   # most often stale package lists (a fresh container has none)
    say "apt-get install failed; apt-get update and retry"
    apt-get update -q >>"$BASE/apt.log" 2>&1 || { tail -20 "$BASE/apt.log" >&2; die "apt-get update failed (log: $BASE/apt.log)"; }
    apt_install || { tail -20 "$BASE/apt.log" >&2; die "apt-get install ${missing[*]} failed (log: $BASE/apt.log)"; }
  fi
  [ "$OUR_POLICY" = 1 ] && rm -f "$POLICY"; OUR_POLICY=0
  say "packages installed"
fi
command -v docker >/dev/null || die "no docker client on PATH (the docker.io package brings one)"

# ------------------------------------------------------------------ 2. a running daemon is reused
# the rules as they were before this base's first start (kept until stop.sh has checked them)
[ -e "$BASE/iptables.before" ] || iptables-save >"$BASE/iptables.before"
if alive "$PIDFILE" dockerd && answers; then
  ensure_rule
  say "dockerd already running (pid $(cat "$PIDFILE"))"
  echo "DOCKER_HOST=unix://$SOCK"
  exit 0
fi
alive "$PIDFILE" dockerd && die "dockerd (pid $(cat "$PIDFILE")) of $BASE runs but does not answer on $SOCK;
stop it first: DOCKER_BASE=$BASE $(dirname "$0")/stop.sh"

# ------------------------------------------------------------------ 3. dockerd
# An empty config file: a /etc/docker/daemon.json meant for the system's daemon (hosts, bridge,
# registry mirrors) must not apply to this one.
echo '{}' >"$BASE/daemon.json"
rm -f "$SOCK"
# no address: dockerd gives it the first /24 of the pool that no route of this host uses
[ -d "/sys/class/net/$BRIDGE/bridge" ] || ip link add "$BRIDGE" type bridge || die "could not create the bridge $BRIDGE"
# setsid: out of the caller's process group, so Ctrl-C in pytest does not reach it
setsid dockerd \
  --config-file "$BASE/daemon.json" \
  --data-root "$BASE/data" --exec-root "$BASE/exec" --pidfile "$PIDFILE" -H "unix://$SOCK" \
  --containerd-namespace "$NS" --containerd-plugins-namespace "$NS-plugins" \
  --bridge "$BRIDGE" --default-address-pool "base=$POOL,size=24" \
  --iptables=false --ip-masq=false --ip-forward=false \
  </dev/null >>"$LOG" 2>&1 &
DPID=$!
for _ in $(seq $(( WAIT_S * 5 ))); do
  answers && break
  kill -0 "$DPID" 2>/dev/null || { tail -20 "$LOG" >&2; die "dockerd exited at start (log: $LOG)"; }
  sleep 0.2
done
answers || { tail -20 "$LOG" >&2; die "timed out after ${WAIT_S}s waiting for dockerd to answer on $SOCK (log: $LOG)"; }
say "dockerd started (pid $(cat "$PIDFILE"), data in $BASE/data, containerd namespace $NS)"
ensure_rule
echo "DOCKER_HOST=unix://$SOCK"
