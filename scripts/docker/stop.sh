#!/usr/bin/env bash
# Stop the private Docker daemon that scripts/docker/start.sh started, and take away what it made.
#
#   sudo scripts/docker/stop.sh            # stop; a later start.sh resumes with the same images
#   sudo scripts/docker/stop.sh --purge    # stop and delete $DOCKER_BASE (images, containers, logs)
#
# In order: every container and user-defined network of the daemon is removed (a container's
# processes end with it), dockerd is stopped by its pid file (SIGTERM, SIGKILL after 30 s), then
# whatever of this base outlived it is killed: its containerd and containerd-shims (their command
# lines name files under $DOCKER_BASE) and processes of its containers (their cgroup names a
# container of $DOCKER_BASE/data). The bridges its networks created are deleted, the mounts under
# $DOCKER_BASE unmounted (and the default bridge start.sh made), and start.sh's iptables rule (the one whose comment names this base)
# deleted; the rules are then compared with those saved before the first start, and a difference
# (another program changed them meanwhile: not ours to undo) is printed as a warning.
# Nothing of another daemon is touched. Safe to run when nothing is running.
#
# Knobs: DOCKER_BASE (default /tmp/sweep-test-docker), the same as for start.sh.
set -uo pipefail

die() { echo "scripts/docker/stop.sh: ERROR: $*" >&2; exit 1; }
PURGE=0
for a in "$@"; do
  case "$a" in
    --purge) PURGE=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) die "unknown argument '$a' (usage: stop.sh [--purge])" ;;
  esac
done
[ "$(id -u)" = 0 ] || die "must run as root (dockerd runs as root)"
BASE=${DOCKER_BASE:-/tmp/sweep-test-docker}
case "$BASE" in /?*) ;; *) die "DOCKER_BASE must be an absolute path other than /, not '$BASE'" ;; esac
BASE=${BASE%/}
SOCK=$BASE/docker.sock PIDFILE=$BASE/dockerd.pid
COMMENT="sweep-test-docker $BASE"

T0=$(date +%s%N)
say() { printf '[docker stop %5.1fs] %s\n' "$(( ($(date +%s%N) - T0) / 1000000 ))e-3" "$*"; }
alive() { local p; p=$(cat "$1" 2>/dev/null) || return 1; [ -n "$p" ] && [ -r "/proc/$p/comm" ] && [[ "$(cat "/proc/$p/comm")" == "$2"* ]]; }
dk() { timeout 60 docker -H "unix://$SOCK" "$@"; }
# end PID...: SIGTERM, up to $GRACE s, then SIGKILL
end() {
  [ $# -eq 0 ] && return 0
  kill -TERM "$@" 2>/dev/null
  local p left
  for _ in $(seq $(( GRACE * 10 ))); do
    left=0; for p in "$@"; do kill -0 "$p" 2>/dev/null && left=1; done
    [ "$left" = 0 ] && return 0; sleep 0.1
  done
  for p in "$@"; do kill -0 "$p" 2>/dev/null && { say "pid $p ignored SIGTERM for ${GRACE}s: SIGKILL"; kill -KILL "$p" 2>/dev/null; }; done
  return 0
}
# ours_by_cmdline: processes whose command line names a file under $BASE (dockerd, its containerd,
# the shims, which are given the containerd socket under exec/)
ours_by_cmdline() {
  local d
  for d in /proc/[0-9]*; do
    [ "${d#/proc/}" = $$ ] && continue
    tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -qF -- "$BASE/" && echo "${d#/proc/}"
  done
}
# ours_by_cgroup: processes inside a container of this daemon (cgroupfs: .../docker/<id>)
ours_by_cgroup() {
  local ids d
  ids=$(ls "$BASE/data/containers" 2>/dev/null | grep -E '^[0-9a-f]{64}$')
  [ -n "$ids" ] || return 0
  for d in /proc/[0-9]*; do
    grep -qF -f <(echo "$ids") "$d/cgroup" 2>/dev/null && echo "${d#/proc/}"
  done
}

# 1. what the daemon has: containers, then user-defined networks (docker deletes their bridges)
BRIDGES=()
if alive "$PIDFILE" dockerd && dk info >/dev/null 2>&1; then
  mapfile -t cs < <(dk ps -aq)
  if [ ${#cs[@]} -gt 0 ]; then dk rm -f "${cs[@]}" >/dev/null && say "removed ${#cs[@]} container(s)"; fi
  mapfile -t ns < <(dk network ls -q --filter type=custom)
  for n in "${ns[@]}"; do
    # the bridge's name: an explicit option, else br- and the network id's first 12 characters
    b=$(dk network inspect -f '{{index .Options "com.docker.network.bridge.name"}}' "$n" 2>/dev/null)
    [ -n "$b" ] && [ "$b" != "<no value>" ] && BRIDGES+=("$b")
  done
  if [ ${#ns[@]} -gt 0 ]; then dk network rm "${ns[@]}" >/dev/null && say "removed ${#ns[@]} network(s)"; fi
fi

# 2. dockerd, by its pid file (it stops its own containerd on the way out)
GRACE=30
if alive "$PIDFILE" dockerd; then
  p=$(cat "$PIDFILE"); end "$p"; say "stopped dockerd (pid $p)"
fi
rm -f "$PIDFILE"

# 3. what outlived it (a dockerd that was killed leaves its containerd, shims and containers)
GRACE=10
# SIGKILL, as `docker rm -f` does: a container's first process ignores SIGTERM unless it handles it
mapfile -t left < <(ours_by_cgroup)
if [ ${#left[@]} -gt 0 ]; then kill -KILL "${left[@]}" 2>/dev/null; say "killed ${#left[@]} leftover container process(es)"; fi
mapfile -t left < <(ours_by_cmdline)
if [ ${#left[@]} -gt 0 ]; then
  say "ending leftover $(for p in "${left[@]}"; do cat "/proc/$p/comm" 2>/dev/null; done | sort | uniq -c | xargs)"
  end "${left[@]}"
fi

# 4. bridges of this daemon's networks still there (a killed daemon leaves them): the network ids
#    are in its network store, whether or not the daemon runs
if [ -f "$BASE/data/network/files/local-kv.db" ]; then
  while read -r id; do BRIDGES+=("br-${id:0:12}"); done < <(
    grep -aoE 'docker/network/v1\.0/(bridge|network)/[0-9a-f]{64}' "$BASE/data/network/files/local-kv.db" \
      | grep -oE '[0-9a-f]{64}$' | sort -u)
fi
# and the default bridge start.sh made (named after the base, as there)
BRIDGES+=("swd$(printf '%s' "$BASE" | sha256sum | cut -c1-8)")
for b in "${BRIDGES[@]}"; do
  if [ -d "/sys/class/net/$b/bridge" ]; then ip link delete "$b" && say "deleted bridge $b"; fi
done

# 5. mounts under the base (network namespaces in exec/netns, overlays in data/overlay2), deepest first
mapfile -t mounts < <(awk -v b="$BASE/" 'index($5, b) == 1 {print $5}' /proc/self/mountinfo | sort -r)
for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null; done
[ ${#mounts[@]} -gt 0 ] && say "unmounted ${#mounts[@]} mount(s) under $BASE"

# 6. iptables: start.sh's rule out, then the rules compared with those before the first start
if command -v iptables-save >/dev/null; then
  n=0
  while read -r rule; do
    # `-A FORWARD ARGS` as iptables-save prints it: the same ARGS delete it (eval: its quotes)
    eval "iptables -w 10 -D ${rule#-A }" && n=$((n + 1))
  done < <(iptables-save -t filter | grep -F -- "--comment \"$COMMENT\"")
  [ "$n" -gt 0 ] && say "deleted $n iptables rule(s) of $BASE"
  if [ -f "$BASE/iptables.before" ]; then
    norm() { grep -vE '^#' | sed -E 's/\[[0-9]+:[0-9]+\]/[-]/'; }
    if diff <(norm <"$BASE/iptables.before") <(iptables-save | norm) >"$BASE/iptables.diff"; then
      say "iptables as before the first start"
    else
      say "WARNING: iptables differ from before the first start (changed by another program meanwhile; left as they are):"
      cat "$BASE/iptables.diff"
    fi
    rm -f "$BASE/iptables.before" "$BASE/iptables.diff"
  fi
fi

# 7. --purge: forget the daemon (only what start.sh puts there, then the folder if nothing else is)
if [ "$PURGE" = 1 ]; then
  rm -rf "$BASE/data" "$BASE/exec" "$SOCK" "$BASE/dockerd.log" "$BASE/daemon.json" "$BASE/apt.log"
  rmdir "$BASE" 2>/dev/null || true
  say "purged $BASE"
fi
exit 0
