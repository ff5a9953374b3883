"""Network plumbing for emulated machines: one bridge, one network namespace per machine joined
to it by a veth pair, one address per machine, optional `tbf` rate shaping on each link.

Everything one cluster creates carries its id in the name (`<prefix><id><kind><index>`, at most
15 characters, the Linux limit for interface names):

    bridge      rdr3fa9c1br        namespaces  rdr3fa9c1m0, rdr3fa9c1m1, ...
    host veths  rdr3fa9c1h0, ...   in-namespace veths  rdr3fa9c1n0, ... (GLOO_SOCKET_IFNAME)

and is recorded, before it is created, in a registry file `<state dir>/<prefix><id>.json` with the
owner's pid and start time. `cleanup_stale()` removes what a dead owner left behind.

Teardown order matters (a namespace deleted while processes still run in it leaves its veth peer
on the host): kill every process in the namespace (`ip netns pids`), delete the host-side veth
(which takes its peer with it), delete the namespace, then the bridge.
"""
from __future__ import annotations

import fcntl
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rudder.bandwidth import check_schedule, parse_rate  # noqa: F401 (re-exported)

log = logging.getLogger("rudder.cluster")

DEFAULT_PREFIX = "rdr"
IFNAME_MAX = 15  # Linux IFNAMSIZ - 1
CMD_TIMEOUT_S = 15.0  # one `ip`/`tc` call; they take milliseconds, a hang must not block teardown
_ID_LEN = 6


class NetnsError(RuntimeError):
    """A namespace, link or qdisc could not be created; the message carries the command's stderr."""


def state_dir() -> Path:
    """Where cluster registries live: /run/rudder-cluster as root (wiped at boot, as are the
    namespaces they describe), else /tmp/rudder-cluster-<uid>. Deliberately not configurable:
    every cluster of this host must see every registry, or cleanup_stale could take a live
    cluster for an orphan."""
    if os.geteuid() == 0 and os.path.isdir("/run"):
        path = Path("/run/rudder-cluster")
    else:
        path = Path(f"/tmp/rudder-cluster-{os.getuid()}")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _state_lock():
    """Serialises subnet choice and creation across clusters of this host (flock)."""
    with open(state_dir() / "lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def check_prefix(prefix: str) -> str:
    if not re.fullmatch(r"[a-z]{1,4}", prefix):
        raise ValueError(f"cluster name prefix must be 1-4 lowercase letters, got {prefix!r}")
    return prefix


def _run(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`{' '.join(args)}` did not finish in {CMD_TIMEOUT_S:.0f} s") from None
    if check and proc.returncode != 0:
        raise NetnsError(f"`{' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def process_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat), or None when
    the process does not exist. Together with the pid it identifies a process across pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = stat[stat.rindex(")") + 2 :].split()
    return int(rest[19])


def process_alive(pid: int, start_time: int | None) -> bool:
    now = process_start_time(pid)
    return now is not None and (start_time is None or now == start_time)


# --------------------------------------------------------------------------------------------
# Availability


def netns_available(prefix: str = DEFAULT_PREFIX) -> tuple[bool, str]:
    """Whether this process can emulate several machines with network namespaces, and why (not).
    Creates and deletes a probe namespace, so the answer is what a real run will meet."""
    if os.geteuid() != 0:
        return False, "not root: network namespaces need root (running one machine on 127.0.0.1)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` not found on PATH (iproute2 / util-linux)"
    probe = f"{check_prefix(prefix)}probe{os.getpid()}{secrets.token_hex(3)}"
    try:
        _run(["ip", "netns", "add", probe])
    except NetnsError as exc:
        return False, f"cannot create a network namespace: {exc}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    tc = "tc available for bandwidth shaping" if shutil.which("tc") else "no `tc`: no shaping"
    return True, f"network namespaces usable (root, iproute2, unshare; {tc})"


# --------------------------------------------------------------------------------------------
# One cluster's network


@dataclass
class ClusterNet:
    """The names and addresses of one cluster's network (also the registry record)."""

    cluster_id: str
    prefix: str
    machines: int
    subnet: str  # "10.a.b.0/24"
    owner_pid: int = field(default_factory=os.getpid)
    owner_start: int | None = None
    bandwidth: str | None = None
    created: float = field(default_factory=time.time)

    @property
    def tag(self) -> str:
        return f"{self.prefix}{self.cluster_id}"

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def namespace(self, i: int) -> str:
        return f"{self.tag}m{i}"

    def host_veth(self, i: int) -> str:
        return f"{self.tag}h{i}"

    def ns_veth(self, i: int) -> str:
        return f"{self.tag}n{i}"

    @property
    def namespaces(self) -> list[str]:
        return [self.namespace(i) for i in range(self.machines)]

    @property
    def addresses(self) -> list[str]:
        net = ipaddress.ip_network(self.subnet)
        return [str(net.network_address + i + 1) for i in range(self.machines)]

    @property
    def bridge_address(self) -> str:
        net = ipaddress.ip_network(self.subnet)
        return str(net.broadcast_address - 1)

    @property
    def registry_path(self) -> Path:
        return state_dir() / f"{self.tag}.json"

    def save(self) -> None:
        tmp = self.registry_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(self.registry_path)

    @classmethod
    def load(cls, path: Path) -> "ClusterNet":
        return cls(**json.loads(path.read_text()))


def _used_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks already on this host (addresses and routes), so a new subnet avoids them."""
    nets = []
    out = _run(["ip", "-o", "-4", "addr", "show"]).stdout + "\n"
    out += _run(["ip", "-4", "route", "show", "table", "all"], check=False).stdout
    for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", out):
        try:
            nets.append(ipaddress.ip_network(token, strict=False))
        except ValueError:
            pass
    # Registries of live clusters too: a bridge may not carry its address yet while being built.
    for path in state_dir().glob("*.json"):
        try:
            nets.append(ipaddress.ip_network(json.loads(path.read_text())["subnet"]))
        except (OSError, ValueError, KeyError):
            pass
    return [n for n in nets if not n.is_loopback and n.prefixlen > 0]


def pick_subnet(cluster_id: str, used: list[ipaddress.IPv4Network]) -> str:
    """10.a.b.0/24 derived from the cluster id (a in 16..239), the first candidate that overlaps
    none of `used`."""
    seed = int(cluster_id, 16)
    for attempt in range(4096):
        h = (seed * 2654435761 + attempt * 40503) & 0xFFFFFFFF
        a, b = 16 + (h >> 8) % 224, h & 0xFF
        cand = ipaddress.ip_network(f"10.{a}.{b}.0/24")
        if not any(cand.overlaps(n) for n in used):
            return str(cand)
    raise NetnsError("no free 10.x.y.0/24 subnet for the cluster bridge")


def create_network(machines: int, prefix: str = DEFAULT_PREFIX,
                   bandwidth: str | None = None) -> ClusterNet:
    """Bridge + one namespace per machine, addressed and (optionally) shaped. On any failure what
    was created is removed again before the error propagates."""
    check_prefix(prefix)
    if machines < 1:
        raise ValueError("machines must be >= 1")
    if len(f"{prefix}{'0' * _ID_LEN}h{machines - 1}") > IFNAME_MAX:
        raise ValueError(f"too many machines ({machines}) for {IFNAME_MAX}-character link names")
    if bandwidth is not None and shutil.which("tc") is None:
        raise NetnsError("bandwidth shaping needs `tc` (iproute2), not found on PATH")
    with _state_lock():
        cid = secrets.token_hex(_ID_LEN // 2)
        net = ClusterNet(cid, prefix, machines, pick_subnet(cid, _used_networks()),
                         owner_start=process_start_time(os.getpid()), bandwidth=bandwidth)
        net.save()  # recorded before anything exists, so a crash mid-way is still found
        try:
            _build(net)
        except BaseException:
            destroy_network(net)
            raise
    log.info("cluster %s: %d namespaces on %s (bridge %s)%s", net.tag, machines, net.subnet,
             net.bridge, f", links shaped to {bandwidth}" if bandwidth else "")
    return net


TBF = ["burst", "64kb", "latency", "50ms"]


def _tbf(rate: str) -> list[str]:
    return ["root", "tbf", "rate", rate, *TBF]


def set_rate(net: ClusterNet, rate: str | None) -> list[str]:
    """Shapes every machine link of `net` to `rate` at once (both directions, as _build does),
    in place: `tc qdisc replace` changes a tbf's rate without dropping the link. None removes
    the shaping. Returns the interfaces changed."""
    done = []
    for i in range(net.machines):
        for prefix, dev in ((["tc"], net.host_veth(i)),
                            (["ip", "netns", "exec", net.namespace(i), "tc"], net.ns_veth(i))):
            if rate is None:
                _run([*prefix, "qdisc", "del", "dev", dev, "root"], check=False)
            else:
                _run([*prefix, "qdisc", "replace", "dev", dev, *_tbf(rate)])
            done.append(dev)
    return done


def link_rate(net: ClusterNet, i: int, inside: bool = False) -> str | None:
    """The tbf rate on machine i's link as `tc -s qdisc show` reports it ("20Mbit"), host side
    (inside=False) or the namespace's side; None when the link is not shaped."""
    prefix = ["ip", "netns", "exec", net.namespace(i), "tc"] if inside else ["tc"]
    dev = net.ns_veth(i) if inside else net.host_veth(i)
    out = _run([*prefix, "-s", "qdisc", "show", "dev", dev], check=False).stdout
    m = re.search(r"qdisc tbf \S+ root .*?\brate (\S+)", out)
    return m.group(1) if m else None


def _build(net: ClusterNet) -> None:
    plen = ipaddress.ip_network(net.subnet).prefixlen
    _run(["ip", "link", "add", net.bridge, "type", "bridge"])
    _run(["ip", "addr", "add", f"{net.bridge_address}/{plen}", "dev", net.bridge])
    _run(["ip", "link", "set", net.bridge, "up"])
    for i, addr in enumerate(net.addresses):
        ns, host, inner = net.namespace(i), net.host_veth(i), net.ns_veth(i)
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", host, "type", "veth", "peer", "name", inner])
        _run(["ip", "link", "set", inner, "netns", ns])
        _run(["ip", "link", "set", host, "master", net.bridge])
        _run(["ip", "link", "set", host, "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{addr}/{plen}", "dev", inner])
        _run(["ip", "-n", ns, "link", "set", inner, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        if net.bandwidth:
            # Both directions of the machine's link: its egress (inside the namespace) and its
            # ingress (the host side's egress towards it), like a full-duplex NIC of that rate.
            tbf = _tbf(net.bandwidth)
            _run(["tc", "qdisc", "add", "dev", host, *tbf])
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", inner, *tbf])


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def _netns_list() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def kill_namespace_processes(ns: str, timeout_s: float = 5.0) -> list[int]:
    """SIGKILL every process inside namespace `ns` until none is left (bounded). Returns the
    pids that were still there at the end (normally none)."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = _run(["ip", "netns", "pids", ns], check=False).stdout
        pids = [int(p) for p in out.split() if p.isdigit()]
        if not pids or time.monotonic() > deadline:
            return pids
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def destroy_network(net: ClusterNet) -> list[str]:
    """Remove everything of `net`, processes in its namespaces included. Never raises; returns
    the names that could not be removed (empty when clean)."""
    problems: list[str] = []
    existing = set(_netns_list())
    for i in range(net.machines):
        ns = net.namespace(i)
        if ns in existing:
            left = kill_namespace_processes(ns)
            if left:
                problems.append(f"{ns}: processes {left} survived SIGKILL")
        if _link_exists(net.host_veth(i)):
            _run(["ip", "link", "del", net.host_veth(i)], check=False)
        if ns in existing:
            res = _run(["ip", "netns", "del", ns], check=False)
            if res.returncode != 0:
                problems.append(f"{ns}: {res.stderr.strip()}")
    # A namespace is freed asynchronously by the kernel; a veth it held may linger briefly.
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        left = [net.host_veth(i) for i in range(net.machines) if _link_exists(net.host_veth(i))]
        if not left:
            break
        for name in left:
            _run(["ip", "link", "del", name], check=False)
        time.sleep(0.05)
    else:
        problems.extend(left)
    if _link_exists(net.bridge):
        res = _run(["ip", "link", "del", net.bridge], check=False)
        if res.returncode != 0:
            problems.append(f"{net.bridge}: {res.stderr.strip()}")
    if problems:
        log.warning("cluster %s teardown left: %s", net.tag, "; ".join(problems))
    else:
        try:
            net.registry_path.unlink()
        except FileNotFoundError:
            pass
    return problems


def cleanup_stale(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Remove what crashed runs left: every registered cluster whose owner process is dead, and
    any namespace or link named `<prefix><6 hex>...` that no live registry owns. Returns the
    cluster tags / names removed."""
    check_prefix(prefix)
    removed: list[str] = []
    live: set[str] = set()
    with _state_lock():
        for path in sorted(state_dir().glob(f"{prefix}*.json")):
            try:
                net = ClusterNet.load(path)
            except (OSError, ValueError, TypeError) as exc:
                log.warning("unreadable cluster registry %s (%s); removing it", path, exc)
                path.unlink(missing_ok=True)
                continue
            if process_alive(net.owner_pid, net.owner_start):
                live.add(net.tag)
                continue
            log.info("removing stale cluster %s (owner pid %d is gone)", net.tag, net.owner_pid)
            destroy_network(net)
            removed.append(net.tag)
        # Orphans without a registry (its file lost): match names of our shape.
        pat = re.compile(rf"^({prefix}[0-9a-f]{{{_ID_LEN}}})(?:m\d+|h\d+|n\d+|br)$")
        for ns in _netns_list():
            m = pat.match(ns)
            if m and m.group(1) not in live:
                pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
                if pids:  # something still runs there: not provably abandoned, leave it
                    log.warning("namespace %s has no registry but runs pids %s; left alone",
                                ns, " ".join(pids))
                    live.add(m.group(1))
                    continue
                _run(["ip", "netns", "del", ns], check=False)
                removed.append(ns)
        links = sorted(os.listdir("/sys/class/net"), key=lambda n: n.endswith("br"))
        for name in links:  # veths first, bridges last
            m = pat.match(name)
            if m and m.group(1) not in live and _link_exists(name):
                _run(["ip", "link", "del", name], check=False)
                removed.append(name)
    return removed
