"""A cluster of several nodes on this machine: network namespaces joined by shaped veth links
(`scripts/netns/start.sh`), for tests and benchmarks across a real, slower link.

Node k is namespace `sweep-node<k>`; its ranks run there (forked by the launch's zygote, each enters
its node's namespace before it opens a socket; with SWEEP_FORK_RANKS=0 started by `ip netns exec`), and
they meet at node 0's address (`HUB_ADDR`). The namespaces share the machine's cores and memory: only the
network between them is apart. `SWEEP_NETNS=sweep-node0,sweep-node1` in the environment makes the
local launcher run a trial of that many nodes in them (`local_nodes`); `shaped_link` makes and
removes them around a block (root only). The local SLURM can have them as its nodes too
(`SLURM_NETNS=1 scripts/slurm/start.sh`: SLURM node `sweep-node<k>`'s slurmd runs in that namespace);
a task it starts there learns where to meet the others from `scheduled_node_environ`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sweeper.errors import SweepError
from sweeper.profiles.profile import same_link

PREFIX = "sweep-node"
NETNS_DIR = Path("/run/netns")  # where `ip netns add` pins each namespace, by name
HUB_ADDR = "10.77.0.1"  # node 0's address, on its loopback: every other node routes to it over its veth
ENV = "SWEEP_NETNS"
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "netns"
RATE = re.compile(r"^\d+(\.\d+)?(kbit|mbit|gbit)$")
DELAY = re.compile(r"^\d+(\.\d+)?(us|ms)$")


@dataclass(frozen=True)
class LocalNodes:
    """The namespaces of a local multi-node cluster, node 0 first, and where the ranks meet."""

    namespaces: tuple[str, ...]
    master_addr: str = HUB_ADDR

    @property
    def nodes(self) -> int:
        return len(self.namespaces)

    def command(self, node: int, argv: list[str]) -> list[str]:
        """`argv` run inside node `node`'s namespace (the same process: `ip netns exec` execs it)."""
        return ["ip", "netns", "exec", self.namespaces[node], *argv]

    def environ(self, node: int) -> dict[str, str]:
        """What a rank of node `node` needs: gloo binds to the interface of the address the host name
        resolves to (the loopback here, which no other node reaches): name the node's veth instead."""
        return {"GLOO_SOCKET_IFNAME": "sw-hub1" if node == 0 else f"sw-node{node}"}

    def address(self, node: int) -> str:
        return HUB_ADDR if node == 0 else f"10.77.{node}.2"


def existing() -> tuple[str, ...]:
    """The `sweep-node<k>` namespaces on this machine, in node order."""
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return ()
    names = [w.split()[0] for w in out.splitlines() if w.startswith(PREFIX)]
    return tuple(sorted(names, key=lambda n: int(n.removeprefix(PREFIX) or 0)))


def current_namespace() -> str | None:
    """The `sweep-node<k>` namespace this process runs in, as `ip netns identify` finds it (the same
    namespace file as its own); None in any other."""
    try:
        mine = os.stat("/proc/self/ns/net")
        names = sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(PREFIX))
    except OSError:
        return None
    for name in names:
        try:
            pinned = os.stat(NETNS_DIR / name)
        except OSError:
            continue
        if (pinned.st_dev, pinned.st_ino) == (mine.st_dev, mine.st_ino):
            return name
    return None


def node_of(namespace: str) -> int:
    """k of `sweep-node<k>`."""
    return int(namespace.removeprefix(PREFIX))


def scheduled_node_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """What a task that a scheduler started on a node of the local cluster must change in its
    torchrun-style `environ` to meet the other nodes across the link, as the local launcher's ranks do
    (`LocalNodes.environ`, `master_addr`): gloo on this node's veth, and MASTER_ADDR the address of
    the node it names when that is one of the namespaces (SLURM's first node name, `sweep-node<j>`).
    Nothing outside a `sweep-node<k>` namespace; a GLOO_SOCKET_IFNAME already set is kept."""
    here = current_namespace()
    if here is None:
        return {}
    nodes = LocalNodes(existing())
    out = {k: v for k, v in nodes.environ(node_of(here)).items() if k not in environ}
    master = environ.get("MASTER_ADDR", "")
    if master in nodes.namespaces:
        out["MASTER_ADDR"] = nodes.address(node_of(master))
    return out


def local_nodes(environ: Mapping[str, str] | None = None) -> LocalNodes | None:
    """The namespaces `SWEEP_NETNS` names (comma-separated, node 0 first), or None when unset.
    A name that is not a namespace on this machine is an error naming it."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return None
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    missing = [n for n in names if n not in existing()]
    if missing:
        raise SweepError(
            f"{ENV}: no network namespace {', '.join(missing)} on this machine; "
            f"start them with: sudo scripts/netns/start.sh RATE [DELAY]"
        )
    if len(names) < 2:
        raise SweepError(f"{ENV}: names one namespace ({raw}); a local cluster of nodes needs two or more")
    return LocalNodes(names)


def check_link(rate: str, delay: str) -> None:
    if not RATE.match(rate):
        raise SweepError(f"--link-rate {rate}: allowed: a rate like 300mbit, 1gbit, 5gbit")
    if not DELAY.match(delay):
        raise SweepError(f"--link-delay {delay}: allowed: a one-way delay like 0us, 200us, 1ms")


def start(rate: str, delay: str = "0us", nodes: int = 2) -> LocalNodes:
    """Make (or remake) the namespaces and their links at `rate` and one-way `delay` (root)."""
    check_link(rate, delay)
    done = subprocess.run(
        [str(SCRIPTS / "start.sh"), rate, delay, str(nodes)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SweepError(f"scripts/netns/start.sh {rate} {delay}: {(done.stderr or done.stdout).strip()[-400:]}")
    return LocalNodes(tuple(f"{PREFIX}{k}" for k in range(nodes)))


def stop() -> None:
    subprocess.run([str(SCRIPTS / "stop.sh")], capture_output=True, check=False)


LOCK = Path("/run/sweep-netns.lock")


@contextmanager
def shaped_link(rate: str, delay: str = "0us", nodes: int = 2) -> Iterator[LocalNodes]:
    """The namespaces and links for the block's duration; removed after it, whatever happens. One
    block at a time on the machine (a lock file): another waits for it rather than reshaping its link."""
    import fcntl

    with open(LOCK, "a") as lock:  # noqa: PTH123 - a lock file held open for the block
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield start(rate, delay, nodes)
        finally:
            stop()


def refuse_another_link(nodes: LocalNodes, *named: tuple[str, str | None]) -> None:
    """Trials on these nodes cross the link as tc shapes it now: each (what, link) that names
    another (a sweep's `cluster.link`, the link its profile was measured across) is refused before
    the first trial, or before a profile is measured (the model would price a link nobody crosses)."""
    now = link_description(nodes)
    for what, link in named:
        if link is not None and not same_link(link, now):
            raise SweepError(
                f"{what} '{link}', but the local nodes' link ({', '.join(nodes.namespaces)}) is '{now}' now: "
                "reshape it (scripts/netns/start.sh) or measure it (`sweep profile --nodes N`)"
            )


def link_description(nodes: LocalNodes) -> str:
    """The shaping of node 1's side of the link as tc reports it (e.g. `tbf 300Mbit, netem 200us`)."""
    out = subprocess.run(
        ["ip", "netns", "exec", nodes.namespaces[1], "tc", "qdisc", "show"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    parts = []
    for line in out.splitlines():
        if m := re.search(r"qdisc tbf .* rate (\S+)", line):
            parts.append(f"tbf {m[1]}")
        if m := re.search(r"qdisc netem .* delay (\S+)", line):
            parts.append(f"netem {m[1]}")
    return ", ".join(parts) or "unshaped"


# ---- iperf-like TCP throughput --------------------------------------------------------------
_SERVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.perf_counter()
    n += len(b)
print(n, time.perf_counter() - t0, flush=True)
"""
_CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
chunk = b"x" * (1 << 20); left = int(sys.argv[3])
while left > 0:
    c.sendall(chunk[: min(left, len(chunk))]); left -= len(chunk)
c.shutdown(socket.SHUT_WR); c.close()
"""


def tcp_rate(nodes: LocalNodes, *, sender: int, receiver: int, nbytes: int, port: int = 5201) -> float:
    """Bytes per second of one TCP stream from node `sender` to node `receiver` (the same node: over
    its loopback), timed by the receiver from its first byte to the end."""
    addr = nodes.address(receiver) if sender != receiver else "127.0.0.1"
    server = subprocess.Popen(
        nodes.command(receiver, [sys.executable, "-c", _SERVER, addr, str(port)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise SweepError(f"the TCP test's receiver in {nodes.namespaces[receiver]} did not start")
        subprocess.run(nodes.command(sender, [sys.executable, "-c", _CLIENT, addr, str(port), str(nbytes)]), check=True)
        got, seconds = server.stdout.readline().split()
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return int(got) / max(float(seconds), 1e-9)


def rate_bytes_per_s(rate: str) -> float:
    """tc's rate (300mbit, 1gbit) in bytes per second."""
    m = re.fullmatch(r"([\d.]+)(kbit|mbit|gbit)", rate.lower())
    if not m:
        raise SweepError(f"link rate {rate}: allowed: a rate like 300mbit, 1gbit, 5gbit")
    return float(m[1]) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m[2]] / 8


def main(argv: list[str]) -> int:
    """`python -m sweeper.launchers.netns RATE [DELAY]`: make the link, print measured TCP rates, remove it."""
    rate, delay = argv[0], (argv[1] if len(argv) > 1 else "0us")
    with shaped_link(rate, delay) as nodes:
        want = rate_bytes_per_s(rate)
        t0 = time.monotonic()
        across = tcp_rate(nodes, sender=1, receiver=0, nbytes=int(max(want, 1e7)))
        inside = tcp_rate(nodes, sender=0, receiver=0, nbytes=int(4e8))
        print(f"link {link_description(nodes)}: across {across / 1e6:.1f} MB/s ({across / want:.0%} of {rate}), ")
        print(f"inside a namespace {inside / 1e6:.0f} MB/s ({inside / across:.1f}x); {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
