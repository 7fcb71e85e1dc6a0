#!/usr/bin/env bash
# Remove the two-node test cluster of scripts/netns/start.sh: every `sweep-node<k>` namespace (its
# veth ends go with it) after killing what still runs inside. Idempotent: nothing there, nothing done.
set -uo pipefail
[ "$(id -u)" = 0 ] || { echo "scripts/netns/stop.sh: ERROR: must run as root" >&2; exit 2; }
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^sweep-node[0-9]+$'); do
  pids=$(ip netns pids "$ns" 2>/dev/null)
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  ip netns delete "$ns" && echo "removed $ns"
done
exit 0
