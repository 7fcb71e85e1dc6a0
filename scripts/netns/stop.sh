#!/usr/bin/env bash
# Remove the two-node test cluster of scripts/netns/start.sh: every `sweep-node<k>` namespace (its
# veth ends go with it, the control veths' root ends `sw-ctl<k>` included) after killing what still
# runs inside (a slurmd of scripts/slurm/start.sh SLURM_NETNS=1 too: stop that SLURM first).
# Idempotent: nothing there, nothing done.
set -uo pipefail
[ "$(id -u)" = 0 ] || { echo "scripts/netns/stop.sh: ERROR: must run as root" >&2; exit 2; }
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^sweep-node[0-9]+$'); do
  pids=$(ip netns pids "$ns" 2>/dev/null)
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  ip netns delete "$ns" && echo "removed $ns"
done
# a root end whose namespace went without it (a start interrupted between the two)
for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E '^sw-ctl[0-9]+$'); do
  ip link delete "$dev" 2>/dev/null && echo "removed $dev"   # (or gone meanwhile, with its namespace)
done
exit 0
