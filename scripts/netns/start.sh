#!/usr/bin/env bash
# A two-node test cluster on one machine: network namespaces joined by a veth pair whose both
# directions are shaped with tc (tbf for the rate, netem for the one-way delay), for sweep's tests
# and benchmarks across a real, slower link (sweeper/launchers/netns.py starts a node's ranks in
# its namespace with `ip netns exec`).
#
#   sudo scripts/netns/start.sh RATE [DELAY] [NODES]   # e.g. 1gbit 200us; 300mbit; 2gbit 0us 2
#   sudo scripts/netns/stop.sh                         # remove them (idempotent)
#
# RATE: tc's rate syntax (300mbit, 1gbit, 5gbit). DELAY: one way, tc's time syntax (0us, 200us,
# 1ms; default 0us). NODES: 2 (default) up to 8; node 0 is the hub, every other node has its own
# veth to it (a star: a node's link is its NIC; traffic between two non-hub nodes crosses two).
# Namespace k is `sweep-node<k>` (lo up), address 10.77.<k>.2 on its end of the veth
# (hub end 10.77.<k>.1; hub node 0's own address, MASTER_ADDR, is 10.77.0.1 on lo alias `sweep0`).
# Running it again replaces the cluster (stop first), so the rate is always the one asked.
#
# The control network, for a SLURM whose slurmd of node k runs in namespace k (scripts/slurm/start.sh
# with SLURM_NETNS=1): each namespace also has an unshaped veth `sw-ctl` to the root namespace,
# 10.78.<k>.2 inside, 10.78.<k>.1 on the root side (`sw-ctl<k>`). slurmctld (root namespace) and
# slurmd talk over it, as do srun, sbatch and sacct run from the root namespace; 10.78.0.1 is the
# address of slurmctld for every node. Between two namespaces the control addresses are routed
# over the shaped link, as on a real cluster, where a batch script's srun on the first node reaches
# the other nodes' slurmd over their NIC (the root namespace forwards nothing: no sysctl or
# firewall outside the namespaces is changed).
# Nothing is changed outside the namespaces but the veth pairs (and their root ends' addresses).
set -euo pipefail
die() { echo "scripts/netns/start.sh: ERROR: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "must run as root (network namespaces and tc)"
[ $# -ge 1 ] && [ $# -le 3 ] || die "usage: start.sh RATE [DELAY] [NODES]   (e.g. start.sh 1gbit 200us)"
RATE=$1 DELAY=${2:-0us} NODES=${3:-2}
[[ "$RATE" =~ ^[0-9]+(\.[0-9]+)?(kbit|mbit|gbit)$ ]] || die "RATE must be like 300mbit, 1gbit or 5gbit, not '$RATE'"
[[ "$DELAY" =~ ^[0-9]+(\.[0-9]+)?(us|ms)$ ]] || die "DELAY must be like 0us, 200us or 1ms, not '$DELAY'"
[[ "$NODES" =~ ^[2-8]$ ]] || die "NODES must be 2 to 8, not '$NODES'"
here=$(dirname "$(readlink -f "$0")")
"$here/stop.sh" >/dev/null
# a half-made cluster is removed again
trap 'rc=$?; [ $rc = 0 ] || "$here/stop.sh" >/dev/null 2>&1; exit $rc' EXIT

# bytes per second of RATE, for the bucket: 4 ms at the rate, at least 256 KiB (veth passes
# GSO packets of up to 64 KiB; a bucket smaller than one would stall the link)
bps=$(python3 -c "import re,sys; v,u=re.fullmatch(r'([\d.]+)(kbit|mbit|gbit)','$RATE').groups(); print(int(float(v)*{'kbit':1e3,'mbit':1e6,'gbit':1e9}[u]/8))")
burst=$(( bps / 250 )); [ "$burst" -ge 262144 ] || burst=262144
delay_us=$(python3 -c "import re; v,u=re.fullmatch(r'([\d.]+)(us|ms)','$DELAY').groups(); print(int(float(v)*(1000 if u=='ms' else 1)))")

shape() {  # namespace, device: tbf at RATE, then netem's delay (when there is one) under it
  local ns=$1 dev=$2
  ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: tbf rate "$RATE" burst "$burst" latency 50ms
  if [ "$delay_us" -gt 0 ]; then
    # a kernel without netem (CONFIG_NET_SCH_NETEM unset) cannot delay: say so, shape the rate only
    ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: netem delay "$DELAY" limit 100000 2>/dev/null \
      || { NO_NETEM=1; return 0; }
  fi
}

NO_NETEM=0
for k in $(seq 0 $((NODES - 1))); do
  ip netns add "sweep-node$k"
  ip -n "sweep-node$k" link set lo up
done
ip -n sweep-node0 addr add 10.77.0.1/32 dev lo
for k in $(seq 1 $((NODES - 1))); do
  ip link add "sw-hub$k" netns sweep-node0 type veth peer name "sw-node$k" netns "sweep-node$k"
  ip -n sweep-node0 addr add "10.77.$k.1/24" dev "sw-hub$k"
  ip -n "sweep-node$k" addr add "10.77.$k.2/24" dev "sw-node$k"
  ip -n sweep-node0 link set "sw-hub$k" up
  ip -n "sweep-node$k" link set "sw-node$k" up
  ip -n "sweep-node$k" route add 10.77.0.1/32 via "10.77.$k.1"
  ip -n "sweep-node$k" route add 10.77.0.0/16 via "10.77.$k.1"
  shape sweep-node0 "sw-hub$k"
  shape "sweep-node$k" "sw-node$k"
done
[ "$NODES" -gt 2 ] && ip netns exec sweep-node0 sysctl -q -w net.ipv4.ip_forward=1
# the control network (see the top)
for k in $(seq 0 $((NODES - 1))); do
  ns=sweep-node$k
  ip link add "sw-ctl$k" type veth peer name sw-ctl netns "$ns"
  ip addr add "10.78.$k.1/24" dev "sw-ctl$k"
  ip link set "sw-ctl$k" up
  ip -n "$ns" addr add "10.78.$k.2/24" dev sw-ctl
  ip -n "$ns" link set sw-ctl up
  if [ "$k" = 0 ]; then
    for j in $(seq 1 $((NODES - 1))); do ip -n "$ns" route add "10.78.$j.2/32" via "10.77.$j.2" dev "sw-hub$j"; done
  else
    ip -n "$ns" route add 10.78.0.1/32 via "10.78.$k.1" dev sw-ctl   # slurmctld, in the root namespace
    ip -n "$ns" route add 10.78.0.0/16 via "10.77.$k.1"              # the other nodes, across the link
  fi
done
# the addresses the ranks bind to: node 0's is MASTER_ADDR
for k in $(seq 0 $((NODES - 1))); do
  addr=$([ "$k" = 0 ] && echo 10.77.0.1 || echo "10.77.$k.2")
  ip -n "sweep-node$k" route get 10.77.0.1 >/dev/null 2>&1 || die "node $k has no route to 10.77.0.1"
  ip -n "sweep-node$k" route get 10.78.0.1 >/dev/null 2>&1 || die "node $k has no route to the control address 10.78.0.1"
  echo "node $k: namespace sweep-node$k address $addr, control address 10.78.$k.2"
done
if [ "$NO_NETEM" = 1 ]; then
  echo "scripts/netns/start.sh: WARNING: this kernel has no netem (CONFIG_NET_SCH_NETEM): the delay $DELAY is not added; the link is the veth's own" >&2
  DELAY="none added (no netem)"
fi
echo "link: $RATE each way, one-way delay $DELAY, $NODES nodes"
