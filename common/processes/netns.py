"""Hosts of their own on one machine: Linux network namespaces joined by one bridge (root only).

`NetworkNamespaces(["broker", "ps0", ...])` is a context manager. Entering it creates a switch
namespace holding a Linux bridge and, per host, a namespace with loopback up and a veth pair:
`eth0` in the host's namespace (its own address, e.g. 10.77.0.2/24), the other end enslaved to
the bridge. Each end of each veth is shaped by an htb qdisc whose one class runs at `rate`
(1gbit), as a link between two machines would be; `rate` may also be {host: rate or None} (None:
that host's link is not shaped, nor delayed). `delay_ms` adds a netem delay under the htb class of each
shaped host's `eth0` (its sending side: a packet between two hosts is delayed once, a round trip twice). The
bridge lives in a namespace of its own, so nothing is added to the root namespace (its routes,
firewall and br_netfilter stay out of the way). `link_bytes(host)` reads the bytes its `eth0` sent
and received, from the kernel's interface counters.

The tests (tests/netns, through tests/support/netns.py) and `zmqflow bench scaling` (bench/scaling.py)
make their hosts with it.

`run(host, argv)` is the command prefix that runs argv in a host's namespace (`ip netns exec`
execs in place, so the process a Supervisor starts is the command itself, and its group is
the command's). Leaving the `with` block, also on an exception or Ctrl-C, deletes every
namespace it made, and with them every veth and the bridge. Every name starts with
`zfq<pid>`; entering first removes what an earlier run left behind when it was killed (names
whose pid is no longer alive, and the processes still running in those namespaces). `netns_unusable()`
says why namespaces cannot be made here, or None; `delay_unusable()` why links cannot be delayed.
"""

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess

PREFIX = "zfq"
SUBNETS = [f"10.77.{i}.0/24" for i in range(256)]
"""Candidate subnets, the first that no address or route of the root namespace overlaps is used."""


def _ip(*args, check=True, timeout=10):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=timeout)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_unusable():
    """Why network namespaces cannot be used here (not root, no `ip`, no netns), or None when they can."""
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    try:
        with _probe_namespace("probe") as probe:
            entered = subprocess.run(["ip", "netns", "exec", probe, "true"], capture_output=True, text=True,
                                     timeout=10)
            if entered.returncode != 0:
                return f"`ip netns exec` does not work here: {entered.stderr.strip() or entered.returncode}"
    except (OSError, subprocess.SubprocessError) as error:
        return f"`ip netns` does not work here: {error}"
    return None


def delay_unusable():
    """Why links cannot be delayed here (the kernel has no netem qdisc, sch_netem), or None when they can.
    Call it where netns_unusable() said None."""
    try:
        with _probe_namespace("delay") as probe:
            _ip("-n", probe, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
            added = subprocess.run(["tc", "-n", probe, "qdisc", "add", "dev", "probe0", "root", "netem", "delay",
                                    "1ms"], capture_output=True, text=True, timeout=10)
            if added.returncode != 0:
                return f"this kernel cannot delay a link (tc's netem qdisc, sch_netem): {added.stderr.strip()}"
    except (OSError, subprocess.SubprocessError) as error:
        return f"a link's delay could not be tried: {error}"
    return None


@contextlib.contextmanager
def _probe_namespace(what):
    """A namespace to try something in, deleted after; OSError saying why `ip netns add` failed."""
    probe = f"{PREFIX}{os.getpid()}-{what}"
    added = _ip("netns", "add", probe, check=False)
    if added.returncode != 0:
        raise OSError(f"`ip netns add` failed: {added.stderr.strip() or added.returncode}")
    try:
        yield probe
    finally:
        _ip("netns", "delete", probe, check=False)


def remove_stale(prefix=PREFIX):
    """Delete the namespaces and root-namespace links named `<prefix><pid>...` whose pid is no longer alive.

    Returns the names removed. The processes still running in such a namespace (orphans of the dead
    run) are killed first. A namespace holds its veth ends, so deleting it deletes them (and a bridge
    in it); root-namespace links are looked for too, should a run ever have made one.
    """
    removed, own = [], re.compile(rf"{re.escape(prefix)}(\d+)")

    def stale(name):
        match = own.match(name)
        return bool(match) and not _pid_alive(int(match.group(1)))
    listed = _ip("netns", "list", check=False).stdout
    for name in (line.split()[0] for line in listed.splitlines() if line.strip()):
        if stale(name):
            # What the dead run started there is orphaned (it would keep the namespace and its veth alive).
            for pid in _ip("netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "delete", name, check=False)
            removed.append(name)
    links = _ip("-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        if stale(name):
            _ip("link", "delete", name, check=False)
            removed.append(name)
    return removed


def free_subnet(candidates=SUBNETS):
    """The first candidate subnet that no IPv4 address or route of the root namespace overlaps."""
    used = []
    for line in _ip("-4", "-o", "addr", "show", check=False).stdout.splitlines():
        match = re.search(r"inet (\S+)", line)
        if match:
            used.append(ipaddress.ip_interface(match.group(1)).network)
    for line in _ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        target = line.split()[0] if line.split() else ""
        if target[:1].isdigit():
            try:
                used.append(ipaddress.ip_network(target, strict=False))
            except ValueError:
                pass
    for candidate in candidates:
        network = ipaddress.ip_network(candidate)
        if not any(network.overlaps(other) for other in used if other.prefixlen > 0):
            return network
    raise RuntimeError(f"every candidate subnet overlaps the root namespace's addresses or routes: {used}")


class NetworkNamespaces:
    """One namespace per host, one bridge between them, a shaped veth per host (see the module docstring)."""

    def __init__(self, hosts, rate="1gbit", subnet=None, prefix=PREFIX, delay_ms=None):
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ValueError(f"host names must be given once each: {hosts}")
        self.hosts, self.rate, self.delay_ms = list(hosts), rate, delay_ms
        self.tag = f"{prefix}{os.getpid()}"          # <= 10 characters: link names stay within 15
        self.prefix = prefix
        self.subnet = ipaddress.ip_network(subnet) if subnet else None
        self.switch = f"{self.tag}-sw"
        self.bridge = f"{self.tag}br"
        self.addresses = {}
        self.created = []                            # namespaces made so far, deleted on exit

    # ------------------------------------------------ names

    def namespace(self, host):
        return f"{self.tag}-{host}"

    def port(self, host):
        """The switch-side end of a host's veth, e.g. zfq12345v3."""
        return f"{self.tag}v{self.hosts.index(host)}"

    def address(self, host):
        """The host's IPv4 address (a string)."""
        return self.addresses[host]

    def run(self, host, argv):
        """The command that runs argv in the host's namespace."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def execute(self, host, argv, timeout=30, **options):
        """Run argv in the host's namespace to its end (bounded); the CompletedProcess, output as text."""
        return subprocess.run(self.run(host, argv), capture_output=True, text=True, timeout=timeout, **options)

    # ------------------------------------------------ making and removing

    def __enter__(self):
        remove_stale(self.prefix)
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _add_namespace(self, name):
        _ip("netns", "add", name)
        self.created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def rate_of(self, host):
        """The rate a host's link is shaped to (tc's units, e.g. 1gbit), or None when it is not shaped."""
        return self.rate.get(host) if isinstance(self.rate, dict) else self.rate

    def _shape(self, namespace, device, rate, delay_ms=None):
        """An htb root qdisc whose default class runs at the link rate, with a netem delay under it if asked."""
        tc = ["tc", "-n", namespace]
        subprocess.run([*tc, "qdisc", "add", "dev", device, "root", "handle", "1:", "htb", "default", "10"],
                       check=True, capture_output=True, text=True, timeout=10)
        subprocess.run([*tc, "class", "add", "dev", device, "parent", "1:", "classid", "1:10", "htb",
                        "rate", rate, "ceil", rate], check=True, capture_output=True, text=True, timeout=10)
        if delay_ms:
            subprocess.run([*tc, "qdisc", "add", "dev", device, "parent", "1:10", "handle", "10:", "netem",
                            "delay", f"{float(delay_ms) * 1000:.0f}us", "limit", "100000"],
                           check=True, capture_output=True, text=True, timeout=10)

    def link_bytes(self, host):
        """{"tx": bytes sent, "rx": bytes received} by the host's eth0 so far (its interface counters)."""
        shown = _ip("-n", self.namespace(host), "-s", "-j", "link", "show", "dev", "eth0").stdout
        stats = json.loads(shown)[0]["stats64"]
        return {"tx": stats["tx"]["bytes"], "rx": stats["rx"]["bytes"]}

    def _create(self):
        subnet = self.subnet or free_subnet()
        hosts_ips = list(subnet.hosts())
        if len(self.hosts) + 1 > len(hosts_ips):
            raise ValueError(f"{subnet} has too few addresses for {len(self.hosts)} hosts")
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", self.bridge, "type", "bridge")
        _ip("-n", self.switch, "link", "set", self.bridge, "up")
        for i, host in enumerate(self.hosts):
            namespace, port = self.namespace(host), self.port(host)
            address = str(hosts_ips[i + 1])         # .1 is left for a gateway nobody needs
            self._add_namespace(namespace)
            # Both ends are made where they live: nothing ever appears in the root namespace.
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _ip("-n", self.switch, "link", "set", port, "master", self.bridge)
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", namespace, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            rate = self.rate_of(host)
            if rate:
                self._shape(self.switch, port, rate)
                self._shape(namespace, "eth0", rate, self.delay_ms)
            self.addresses[host] = address
        self.subnet = subnet

    def close(self):
        """Delete every namespace made (their veths and the bridge go with them); idempotent."""
        problems = []
        for name in reversed(self.created):
            result = _ip("netns", "delete", name, check=False)
            if result.returncode != 0 and name in _ip("netns", "list", check=False).stdout.split():
                problems.append(f"{name}: {result.stderr.strip()}")
        self.created.clear()
        if problems:
            raise RuntimeError("could not delete network namespaces: " + "; ".join(problems))

    def leftovers(self):
        """Namespaces and root-namespace links of this instance still present (empty after close)."""
        names = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
        links = [line.split(":", 2)[1].strip().split("@")[0]
                 for line in _ip("-o", "link", "show", check=False).stdout.splitlines() if line.count(":") >= 2]
        return [name for name in names + links if name.startswith(self.tag)]
