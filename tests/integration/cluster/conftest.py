"""Fixtures and helpers for the multi-node (replication) integration tests.

A test asks for ``cluster``: a coordinator (``hwfs coord ... -f``, started with
Popen, log in the cluster's temp dir) and three nodes A, B, C (``hwfs mount
MNT --store STORE --join COORD --node NAME --listen URL``), each with its own
store under /dev/shm and mountpoint under /tmp.  Starting a cluster costs three
mounts and a join, so one cluster serves every test of the module: the
``cluster`` fixture hands out the module's cluster and starts a fresh one only
when there is none yet or the last one is no longer healthy (the watchdog
killed it, a daemon died).  Tests therefore do not rely on what earlier tests
left behind; they state what they need with idempotent helpers
(``cluster.ensure_version("v1")`` publishes v1 on A unless it is there and waits
until every node holds it; ``cluster.ensure_committed("v1")``), so each test
also runs on its own (``-k``).

Teardown always runs, in this order: every node is unmounted (``hwfs umount``,
then ``fusermount3 -u -z``; the daemon pid from ``hwfs status --json`` is
killed if still alive — the parent suite's ``HwfsMount.cleanup``), then the
coordinator gets SIGTERM, SIGKILL after 5 s, and the temp dirs are removed.
The nodes and the coordinator are registered with the parent suite's watchdog
(``_ACTIVE``): a test that runs past its ``@pytest.mark.limit`` gets them all
killed, and the next test starts a fresh cluster.

When a test fails, the coordinator's log and every node's daemon log are added
to its report.

This directory is a package (``__init__.py``) on purpose: a second top-level
``conftest`` module would replace the parent's in ``sys.modules`` and break
the parent tests' ``from conftest import ...``.  As a package, this file is
``cluster.conftest`` and ``import conftest`` below is the parent's module,
already imported by pytest — the same ``_ACTIVE`` list its watchdog reads.
"""

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

import conftest as base  # tests/integration/conftest.py

if Path(base.__file__).resolve() != Path(__file__).resolve().parents[1] / "conftest.py":
    raise ImportError(f"`conftest` is {base.__file__}, expected the parent tests/integration/conftest.py")

from conftest import (HWFS, HwfsMount, find_all, flip_byte, is_mounted,  # noqa: E402
                      pid_alive, poll, random_file, read_text, sh, wait_dead)

NODE_NAMES = ("A", "B", "C")
NODE_CAPACITY = "1G"
CONVERGE_TIMEOUT = base.scaled(60.0)   # seconds for a version to reach every node
JOIN_TIMEOUT = base.scaled(30.0)       # seconds for all nodes to show up alive in status --cluster
COORD_READY_TIMEOUT = base.scaled(10.0)
TOPOLOGY = os.environ.get("HWFS_TOPOLOGY")  # chain|star; unset: the coordinator's default


# --------------------------------------------------------------------------
# small helpers


# Every coordinator and node listens on a port it picks itself (zmq binds
# `tcp://HOST:*`); the fixtures read the bound endpoint back: the coordinator's
# "coord: listening on URL" log line, a node's `hwfs status --json` "listen".
ANY_PORT = "tcp://127.0.0.1:*"
LISTENING = re.compile(r"coord: listening on (tcp://\S+)")


def tail(path, n=60):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"(no log: {e})"


def readlink(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


# --------------------------------------------------------------------------
# synthetic models: 20 float32 tensors of 1..2 MiB (about 30 MiB) in two
# safetensors files plus a config.json.  Every version is the base model with
# a few tensors replaced by values unique to that version, so versions share
# most shards (cheap to replicate) and each one's changed tensors occur in no
# other version (the damage test can find them in an arena).

N_TENSORS = 20
MODEL_SEED = 4242
VERSIONS = {
    # name: indices of the tensors that differ from v1 (2 of 20 = 10%)
    "v1": (),
    "v2": (3, 11),
    "v3": (5, 15),
    "v4": (7, 17),
    "v5": (9, 19),
}


class Model:
    def __init__(self, name, path, tensors, changed):
        self.name = name
        self.path = path            # the source directory
        self.tensors = tensors      # name -> numpy array
        self.changed = changed      # names of the tensors that differ from v1

    @property
    def changed_bytes(self):
        return sum(self.tensors[n].nbytes for n in self.changed)

    @property
    def files(self):
        return sorted(str(p) for p in Path(self.path).iterdir())


def build_model(root, name, changed_idx):
    import numpy as np
    from safetensors.numpy import save_file

    variant = list(VERSIONS).index(name)
    rows = np.random.default_rng([MODEL_SEED, 0xA11]).integers(16, 33, size=N_TENSORS) * 64
    tensors = {}
    for i in range(N_TENSORS):
        v = variant if i in changed_idx else 0
        rng = np.random.default_rng([MODEL_SEED, i, v])
        tensors[f"model.layers.{i}.weight"] = rng.standard_normal((int(rows[i]), 256), dtype=np.float32)
    names = list(tensors)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    half = N_TENSORS // 2
    save_file({k: tensors[k] for k in names[:half]}, str(root / "model-00001-of-00002.safetensors"),
              metadata={"format": "np"})
    save_file({k: tensors[k] for k in names[half:]}, str(root / "model-00002-of-00002.safetensors"),
              metadata={"format": "np"})
    (root / "config.json").write_text(json.dumps(
        {"architectures": ["TestForCausalLM"], "hidden_size": 256, "num_hidden_layers": N_TENSORS}, indent=2))
    return Model(name, root, tensors, [names[i] for i in changed_idx])


class Models:
    """Source directories of v1..v5, built on first use, kept for the session."""

    def __init__(self, root):
        self.root = Path(root)
        self._made = {}

    def __getitem__(self, name):
        if name not in self._made:
            self._made[name] = build_model(self.root / name, name, VERSIONS[name])
        return self._made[name]


# --------------------------------------------------------------------------
# processes


class Coordinator:
    """`hwfs coord --listen URL --state DIR -f`, run in the foreground by Popen."""

    def __init__(self, workdir):
        self.url = ANY_PORT  # the bound endpoint once started (a restart reuses it)
        self.state = os.path.join(workdir, "coord-state")
        os.makedirs(self.state, exist_ok=True)
        self.logpath = os.path.join(workdir, "coord.log")
        self.proc = None
        self._log = None

    def log_tail(self, n=60):
        return tail(self.logpath, n)

    def args(self):
        """The `hwfs coord` command line (subclasses add options)."""
        args = [HWFS, "coord", "--listen", self.url, "--state", self.state, "--insecure"]
        if TOPOLOGY:
            args += ["--topology", TOPOLOGY]
        return args + ["-f"]

    def env(self):
        """The coordinator's environment (None: this process's; subclasses add tunables)."""
        return None

    def start(self):
        args = self.args()
        self._log = open(self.logpath, "ab")
        self._log.write(f"=== test: starting {' '.join(args)}\n".encode())
        self._log.flush()
        start = self._log.tell()
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=self.env())
        end = time.monotonic() + COORD_READY_TIMEOUT
        while True:
            rc = self.proc.poll()
            if rc is not None:
                pytest.fail(f"`{' '.join(args)}` exited with {rc} before accepting connections\n"
                            f"log:\n{self.log_tail()}", pytrace=False)
            with open(self.logpath, "rb") as f:  # the port it bound, from this start's log
                f.seek(start)
                m = LISTENING.search(f.read().decode(errors="replace"))
            if m:
                self.url = m.group(1)
                return
            if time.monotonic() >= end:
                pytest.fail(f"coordinator did not log the endpoint it listens on ({self.url}) within "
                            f"{COORD_READY_TIMEOUT:.0f}s\nlog:\n{self.log_tail()}", pytrace=False)
            time.sleep(0.05)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill_daemons(self):
        """Watchdog: SIGKILL the coordinator."""
        if self.alive():
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self):
        """SIGTERM, SIGKILL after 5 s; always reaps and closes the log."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                try:
                    os.kill(self.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    try:
                        os.kill(self.proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    self.proc.wait(timeout=10)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None


class ClusterNode(HwfsMount):
    """A node: an HwfsMount whose `hwfs mount` joins the coordinator."""

    def __init__(self, name, coord_url, capacity=NODE_CAPACITY, preallocate=False):
        super().__init__(capacity)
        self.name = name
        self.coord_url = coord_url
        self.preallocate = preallocate
        self.url = ANY_PORT  # the bound endpoint once mounted (a remount reuses it)

    def mount(self):
        st = super().mount()
        if self.url == ANY_PORT:
            self.url = st["listen"]
        return st

    def __repr__(self):
        return f"<node {self.name} {self.mnt}>"

    def mount_args(self):
        return super().mount_args() + ["--join", self.coord_url, "--node", self.name,
                                       "--listen", self.url, "--insecure"] + (
                                           ["--preallocate"] if self.preallocate else [])

    def healthy(self):
        return self.pid is not None and pid_alive(self.pid) and is_mounted(self.mnt)

    # -- what the tests look at
    def cluster_status(self):
        cp = self.run("status", "--cluster", "--json")
        try:
            return json.loads(cp.stdout)
        except ValueError as e:
            pytest.fail(f"hwfs status --cluster --json on {self.name} printed invalid JSON ({e}): {cp.stdout!r}")

    def bytes_received(self):
        return int(self.status()["replication"]["bytes_received"])

    def current(self):
        """(readlink of MNT/current, status current)."""
        return readlink(self.path("current")), self.status().get("current")

    def visible(self, version):
        return version in os.listdir(self.path("versions"))


class Cluster:
    def __init__(self, names=NODE_NAMES):
        self.names = list(names)
        self.dir = tempfile.mkdtemp(prefix="hwfs-cluster-")
        self.coord = Coordinator(self.dir)
        self.nodes = {}
        self.digests = {}      # version -> digest, once converged
        self.unconverged = {}  # version -> why it never reached every node (fail fast later)

    def __getitem__(self, name):
        return self.nodes[name]

    def __iter__(self):
        return iter(self.nodes.values())

    def others(self, *names):
        return [n for n in self if n.name not in names]

    # -- life cycle
    def start(self):
        base._ACTIVE.append(self.coord)
        self.coord.start()
        for name in self.names:
            # The last node preallocates its arena: received shards are then
            # copied into the mapping instead of pwritten (both paths tested).
            node = ClusterNode(name, self.coord.url, preallocate=name == self.names[-1])
            self.nodes[name] = node
            base._ACTIVE.append(node)
            node.mount()
        self.wait_members()

    def wait_members(self, timeout=JOIN_TIMEOUT):
        """Until A's `status --cluster` lists every node alive and every node
        reports its own name and the coordinator."""
        want = set(self.names)
        last = {}

        def joined():
            nonlocal last
            for node in self:
                st = node.status()
                if st.get("node") != node.name or st.get("coordinator") != self.coord.url:
                    last = {"node": node.name, "status": st}
                    return False
            cs = self.nodes[self.names[0]].cluster_status()
            last = cs
            alive = {n.get("name") for n in cs.get("nodes", []) if n.get("alive")}
            return alive == want

        if not poll(joined, timeout=timeout, interval=0.2):
            pytest.fail(f"the cluster did not form within {timeout:.0f}s (want {sorted(want)} alive); "
                        f"last seen: {json.dumps(last)}\n{self.logs()}", pytrace=False)

    def healthy(self):
        return self.coord.alive() and len(self.nodes) == len(self.names) and all(n.healthy() for n in self)

    def stop(self):
        """Unmount every node, then stop the coordinator, remove the temp dirs.
        Always runs to the end."""
        try:
            for node in reversed(list(self.nodes.values())):
                try:
                    node.cleanup()
                except Exception:
                    pass
                finally:
                    if node in base._ACTIVE:
                        base._ACTIVE.remove(node)
        finally:
            try:
                self.coord.stop()
            finally:
                if self.coord in base._ACTIVE:
                    base._ACTIVE.remove(self.coord)
                shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self, n=40):
        parts = [f"--- coordinator {self.coord.url} (pid {self.coord.proc.pid if self.coord.proc else None}) "
                 f"log:\n{self.coord.log_tail(n)}"]
        for node in self:
            parts.append(f"--- node {node.name} {node.url} mnt {node.mnt} (pid {node.pid}) log:\n{node.log_tail(n)}")
        return "\n".join(parts)

    # -- versions
    def publish(self, node_name, model, version=None):
        version = version or model.name
        node = self.nodes[node_name]
        node.run("publish", model.path, version)
        v = node.version(version)
        assert v and v["state"] == "sealed", f"{version} after publish on {node_name}: {v}"
        return v["digest"]

    def wait_version(self, version, digest, nodes=None, timeout=CONVERGE_TIMEOUT):
        """Poll until every one of @nodes (default: all) shows @version in
        MNT/versions/ and status says sealed with @digest.  Fails at once if a
        node shows it in MNT/versions/ before it is sealed with that digest
        (half-visible) or with another digest.  Returns the seconds it took."""
        nodes = list(self) if nodes is None else list(nodes)
        t0 = time.monotonic()
        end = t0 + timeout
        pending = {n.name: n for n in nodes}
        seen = {}
        while True:
            for name, node in list(pending.items()):
                vis = node.visible(version)
                rec = node.version(version)
                seen[name] = {"visible": vis, "status": rec}
                if vis:
                    if rec is None or rec["state"] != "sealed":
                        pytest.fail(f"{version} is visible in {name}'s MNT/versions/ but its status is {rec} "
                                    f"(a version must appear only when complete)")
                    if rec["digest"] != digest:
                        pytest.fail(f"{version} on {name} has digest {rec['digest']}, the publisher's is {digest}")
                    del pending[name]
            if not pending:
                return time.monotonic() - t0
            if time.monotonic() >= end:
                why = (f"{version} did not reach {sorted(pending)} within {timeout:.0f}s; "
                       f"last seen: {json.dumps(seen)}")
                self.unconverged[version] = why
                pytest.fail(f"{why}\n{self.status_dump()}", pytrace=False)
            time.sleep(0.1)

    def ensure_version(self, version, models, origin="A"):
        """@version (from @models) on every node, published on @origin unless
        some earlier test already did.  Returns its digest."""
        if version in self.unconverged:
            pytest.fail(f"precondition: {self.unconverged[version]} (in an earlier test)", pytrace=False)
        if version in self.digests:
            return self.digests[version]
        node = self.nodes[origin]
        rec = node.version(version)
        digest = rec["digest"] if rec else self.publish(origin, models[version], version)
        self.wait_version(version, digest)
        self.digests[version] = digest
        return digest

    def ensure_committed(self, version):
        """Every node's current is @version (commits on B if not)."""
        if all(n.current() == (f"versions/{version}", version) for n in self):
            return
        self.nodes["B"].run("commit", version)
        for n in self:
            assert n.current() == (f"versions/{version}", version), f"{n.name} after commit {version}: {n.current()}"

    def status_dump(self):
        out = []
        for node in self:
            try:
                st = node.run("status", "--json", check=False, timeout=10).stdout
                cs = node.run("status", "--cluster", "--json", check=False, timeout=10)
                out.append(f"--- {node.name} status: {st.strip()}\n--- {node.name} status --cluster: "
                           f"{cs.stdout.strip()} {cs.stderr.strip()}")
            except BaseException as e:  # the dump must not hide the real failure
                out.append(f"--- {node.name}: status failed: {e!r}")
        return "\n".join(out)


class Inotify:
    """`inotifywait -m PATH` in the background; `wait_for(event, name)`."""

    def __init__(self, path):
        self.path = path
        self.lines = []
        self._q = queue.Queue()
        self.proc = None

    def __enter__(self):
        self.proc = subprocess.Popen(["inotifywait", "-m", self.path], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def reader(p=self.proc, q=self._q):
            for line in p.stdout:
                q.put(line.rstrip("\n"))

        threading.Thread(target=reader, daemon=True).start()
        try:
            self._until(lambda s: "Watches established" in s, 10, "inotifywait did not start")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc.stdout.close()
            self.proc = None

    def _until(self, pred, timeout, what):
        end = time.monotonic() + timeout
        while True:
            for s in self.lines:
                if pred(s):
                    return s
            left = end - time.monotonic()
            if left <= 0:
                pytest.fail(f"{what} within {timeout}s; inotifywait -m {self.path} printed {self.lines}",
                            pytrace=False)
            try:
                self.lines.append(self._q.get(timeout=min(left, 0.5)))
            except queue.Empty:
                pass

    def wait_for(self, events, name, timeout=10):
        """The first line reporting one of @events (e.g. ("MOVED_TO", "CREATE"))
        for entry @name.  Lines look like `DIR/ EV1,EV2 NAME`."""
        def match(line):
            parts = line.split(" ")
            if len(parts) < 3 or parts[-1] != name:
                return False
            return bool(set(parts[-2].split(",")) & set(events))

        return self._until(match, timeout, f"no {'/'.join(events)} {name} event")


# --------------------------------------------------------------------------
# fixtures


class _Holder:
    def __init__(self):
        self.cluster = None
        self.start_error = None

    def get(self):
        if self.start_error:
            pytest.fail(f"the cluster could not be started (earlier in this module):\n{self.start_error}",
                        pytrace=False)
        if self.cluster is not None and not self.cluster.healthy():
            # Killed by the watchdog or a daemon died: start over.
            self.close()
        if self.cluster is None:
            cl = Cluster()
            try:
                cl.start()
            except BaseException as e:
                self.start_error = str(e)
                cl.stop()
                raise
            self.cluster = cl
        return self.cluster

    def close(self):
        if self.cluster is not None:
            cl, self.cluster = self.cluster, None
            cl.stop()


@pytest.fixture(scope="module")
def _cluster_holder():
    h = _Holder()
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def cluster(_cluster_holder, request):
    """The module's running cluster (A, B, C joined to one coordinator)."""
    cl = _cluster_holder.get()
    request.node._hwfs_cluster = cl
    return cl


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    return Models(tmp_path_factory.mktemp("cluster-models"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    cl = getattr(item, "_hwfs_cluster", None)
    if cl is not None and rep.failed and rep.when in ("setup", "call"):
        try:
            rep.sections.append(("hwfs cluster logs", cl.logs()))
        except Exception as e:  # never let log collection hide the failure
            rep.sections.append(("hwfs cluster logs", f"(could not read logs: {e!r})"))
    return rep


# --------------------------------------------------------------------------
# the ``net`` fixture: clusters built per test, with options (test_chaos.py,
# test_security.py, test_latejoin.py)

CHUNK = 4 << 20  # fixed_chunk: shard size of files that are not safetensors
STATUS_TIMEOUT = base.scaled(25)  # status --cluster answers or fails within ~10 s


class Coord(Coordinator):
    """`hwfs coord` with options; can be killed -9 and restarted on the same
    port and state dir."""

    def __init__(self, workdir, topology=None, keys=None, state=True, extra=(), tunables=None):
        super().__init__(workdir)
        self.topology = topology
        self.keys = keys
        self.use_state = state
        self.extra = list(extra)
        self.tunables = dict(tunables or {})  # name -> value, as HWFS_NAME in its environment

    def env(self):
        if not self.tunables:
            return None
        env = dict(os.environ)
        env.update({f"HWFS_{k.upper()}": str(v) for k, v in self.tunables.items()})
        return env

    def args(self):
        args = [HWFS, "coord", "--listen", self.url]
        if self.use_state:
            args += ["--state", self.state]
        if self.topology:
            args += ["--topology", self.topology]
        args += ["--keys", self.keys] if self.keys else ["--insecure"]
        return args + self.extra + ["-f"]

    def kill9(self):
        """kill -9, reap, close the log (start() may follow: same port, same state)."""
        assert self.alive(), "the coordinator is not running"
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self):
        return read_text(self.logpath)


class Node(ClusterNode):
    """A node whose `hwfs mount` may carry --keys or run an embedded coordinator."""

    def __init__(self, name, coord_url, keys=None, embedded=None, capacity=NODE_CAPACITY, extra=()):
        super().__init__(name, embedded or coord_url, capacity=capacity)
        self.keys = keys
        self.embedded = embedded  # tcp://... of a --coordinator in this daemon
        self.extra = list(extra)  # more `hwfs mount` options (-o NAME=VALUE, ...)

    def mount_args(self):
        args = [HWFS, "mount", self.mnt, "--store", self.store]
        args += ["--coordinator", self.embedded] if self.embedded else ["--join", self.coord_url]
        args += ["--node", self.name, "--listen", self.url]
        if self.capacity:
            args += ["--capacity", str(self.capacity)]
        args += ["--keys", self.keys] if self.keys else ["--insecure"]
        return args + self.extra

    def try_cluster_status(self, timeout=STATUS_TIMEOUT):
        """`status --cluster --json`: the dict, or None when it fails."""
        cp = self.run("status", "--cluster", "--json", check=False, timeout=timeout)
        if cp.returncode != 0:
            return None
        try:
            return json.loads(cp.stdout)
        except ValueError:
            return None

    def sent(self):
        return int(self.status()["replication"]["bytes_sent"])

    def kill9_daemon(self):
        """kill -9 the daemon (pid from its status), then `fusermount3 -u -z` the dead mount."""
        pid = int(self.status()["pid"])
        if pid not in self.pids:
            self.pids.append(pid)
        os.kill(pid, signal.SIGKILL)
        assert wait_dead(pid, 10), f"{self.name}'s daemon {pid} survived SIGKILL"
        sh(["fusermount3", "-u", "-z", self.mnt], check=False)
        assert not is_mounted(self.mnt), f"could not detach {self.name}'s dead mount {self.mnt}"
        self.mounted = False
        # A daemon killed inside a request to its own mount (a rename through
        # it) finishes dying only once the detach aborted that request: until
        # then it holds the store's lock, and a remount would be refused.
        assert poll(lambda: store_unlocked(self.store), timeout=10, interval=0.05), \
            f"{self.name}'s store {self.store} is still locked 10 s after its daemon was killed"


def store_unlocked(store):
    """True when no process holds the flock of @store/lock (the daemon's)."""
    import fcntl
    try:
        fd = os.open(os.path.join(store, "lock"), os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def node_view(cs, name):
    """The record of node @name in a status --cluster answer, or None."""
    for n in (cs or {}).get("nodes", []):
        if n.get("name") == name:
            return n
    return None


def version_view(cs, node, version):
    n = node_view(cs, node)
    for v in (n or {}).get("versions", []):
        if v.get("name") == version:
            return v
    return None


class Net:
    """A coordinator and nodes started one at a time; all cleaned up at the end."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="hwfs-chaos-")
        self.coord = None
        self.nodes = {}

    def __getitem__(self, name):
        return self.nodes[name]

    def __iter__(self):
        return iter(list(self.nodes.values()))

    def others(self, *names):
        return [n for n in self if n.name not in names]

    def start_coord(self, **kw):
        c = Coord(self.dir, **kw)
        self.coord = c
        base._ACTIVE.append(c)
        c.start()
        return c

    def add(self, name, wait=True, viewer=None, keys=None, embedded=None, coord_url=None,
            capacity=NODE_CAPACITY, extra=()):
        """Mount node @name joined to the coordinator (@capacity, @extra mount
        options); with @wait, return once @viewer's (default: the new node's)
        status --cluster lists it alive."""
        url = coord_url or (self.coord.url if self.coord else None)
        node = Node(name, url, keys=keys, embedded=embedded, capacity=capacity, extra=extra)
        self.nodes[name] = node
        base._ACTIVE.append(node)
        node.mount()
        if wait:
            self.wait_alive([name], viewer=viewer or node)
        return node

    def wait_alive(self, names, viewer=None, timeout=30.0, committed=...):
        """Until @viewer's status --cluster lists every one of @names alive (and,
        if given, reports @committed).  Returns the status seen."""
        viewer = viewer or next(iter(self))
        last = [None]

        def ok():
            cs = viewer.try_cluster_status()
            last[0] = cs
            if cs is None:
                return None
            alive = {n["name"] for n in cs.get("nodes", []) if n.get("alive")}
            if not set(names) <= alive:
                return None
            if committed is not ... and cs.get("committed") != committed:
                return None
            return cs

        cs = poll(ok, timeout=timeout, interval=0.2)
        if not cs:
            want = f"{sorted(names)} alive" + ("" if committed is ... else f", committed {committed}")
            pytest.fail(f"{viewer.name}'s status --cluster did not show {want} within {timeout:.0f}s; "
                        f"last seen: {json.dumps(last[0])}\n{self.logs()}", pytrace=False)
        return cs

    def wait_dead(self, name, viewer, timeout=15.0):
        def dead():
            cs = viewer.try_cluster_status()
            n = node_view(cs, name)
            return n is not None and not n.get("alive")

        assert poll(dead, timeout=timeout, interval=0.2), \
            f"the coordinator still lists {name} alive {timeout:.0f}s after it stopped"

    def wait_version(self, version, digest, nodes=None, timeout=60.0):
        """Every one of @nodes shows @version in MNT/versions/, sealed with @digest
        (never visible before that).  Returns the seconds it took."""
        nodes = list(self) if nodes is None else list(nodes)
        timeout = base.scaled(timeout)
        t0 = time.monotonic()
        pending = {n.name: n for n in nodes}
        seen = {}
        while pending:
            for name, node in list(pending.items()):
                vis = node.visible(version)
                rec = node.version(version)
                seen[name] = {"visible": vis, "status": rec}
                if vis:
                    assert rec is not None and rec["state"] == "sealed", \
                        f"{version} is visible on {name} but its status is {rec} (must appear only complete)"
                    assert rec["digest"] == digest, \
                        f"{version} on {name} has digest {rec['digest']}, the publisher's is {digest}"
                    del pending[name]
            if pending and time.monotonic() - t0 >= timeout:
                pytest.fail(f"{version} did not reach {sorted(pending)} within {timeout:.0f}s; last seen: "
                            f"{json.dumps(seen)}\n{self.status_dump(pending.values())}", pytrace=False)
            if pending:
                time.sleep(0.1)
        return time.monotonic() - t0

    def publish(self, name, src, version):
        node = self.nodes[name]
        node.run("publish", src, version)
        v = node.version(version)
        assert v and v["state"] == "sealed", f"{version} after publish on {name}: {v}"
        return v["digest"]

    def currents(self, nodes=None):
        return {n.name: n.current() for n in (self if nodes is None else nodes)}

    def stop(self):
        try:
            for node in reversed(list(self.nodes.values())):
                try:
                    node.cleanup()  # handles a dead (-z detached) mount too
                except Exception:
                    pass
                finally:
                    if node in base._ACTIVE:
                        base._ACTIVE.remove(node)
        finally:
            try:
                if self.coord is not None:
                    self.coord.stop()
            finally:
                if self.coord in base._ACTIVE:
                    base._ACTIVE.remove(self.coord)
                shutil.rmtree(self.dir, ignore_errors=True)

    def status_dump(self, nodes):
        """status --json and status --cluster --json of @nodes (the healthy ones), for failures."""
        out = []
        for node in nodes:
            if not node.healthy():
                out.append(f"--- {node.name}: daemon not running / not mounted")
                continue
            try:
                st = node.run("status", "--json", check=False, timeout=10)
                cs = node.run("status", "--cluster", "--json", check=False, timeout=15)
                out.append(f"--- {node.name} status: {st.stdout.strip()}\n--- {node.name} status --cluster: "
                           f"{cs.stdout.strip()} {cs.stderr.strip()}")
            except BaseException as e:  # the dump must not hide the real failure
                out.append(f"--- {node.name}: status failed: {e!r}")
        return "\n".join(out)

    def logs(self, n=40):
        parts = []
        if self.coord is not None:
            parts.append(f"--- coordinator {self.coord.url} log:\n{self.coord.log_tail(n)}")
        for node in self:
            parts.append(f"--- node {node.name} {node.url} mnt {node.mnt} (pids {node.pids}) log:\n"
                         f"{node.log_tail(n)}")
        return "\n".join(parts)


@pytest.fixture
def net(request):
    n = Net()
    request.node._hwfs_cluster = n  # conftest.py's report hook adds n.logs() on failure
    try:
        yield n
    finally:
        n.stop()


# --------------------------------------------------------------------------
# data


def publish_killing(pub, victim, src, version):
    """`hwfs publish @src @version` on node @pub, and kill -9 of node @victim's daemon as
    soon as it holds part of the version (its own bytes_received: no coordinator round
    trip).  Returns the version's digest on @pub; fails the test when the publish failed or
    the victim was not caught mid-transfer (the kill would have tested nothing)."""
    proc = subprocess.Popen([base.HWFS, "publish", str(src), version, "-m", pub.mnt],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    caught = False
    end = time.monotonic() + 30
    try:
        while time.monotonic() < end:
            if victim.visible(version):
                break
            if victim.bytes_received() > 0:
                caught = True
                break
            time.sleep(0.005)
        state = {"visible": victim.visible(version), "bytes_received": victim.bytes_received()}
        victim.kill9_daemon()
    finally:
        _, err = proc.communicate(timeout=base.TIMEOUT)
    assert proc.returncode == 0, f"publish on {pub.name} failed: {err}"
    assert caught and not state["visible"], \
        f"{victim.name} was not caught mid-transfer ({state}); the kill tested nothing"
    print(f"{victim.name} killed with {state}")
    return pub.version(version)["digest"]


@contextmanager
def shaped_from(node, rate):
    """Everything @node's data socket sends on loopback goes out at @rate at most (tc
    units: "64mbit", "8kbit"; tc: an htb root on lo whose default class is unlimited, and
    a class of @rate that a
    u32 filter on the socket's source port feeds): a transfer from @node takes at least
    its size over that rate, however fast or loaded the machine is, while every process
    keeps running (its heartbeats too).  Removed on the way out; a root qdisc already on
    lo fails the test rather than being replaced."""
    port = int(node.status()["listen"].rsplit(":", 1)[1])
    dev = ["dev", "lo"]
    sh(["tc", "qdisc", "add", *dev, "root", "handle", "1:", "htb", "default", "1"])
    try:
        for cls, r in (("1:1", "100gbit"), ("1:2", rate)):
            sh(["tc", "class", "add", *dev, "parent", "1:", "classid", cls, "htb", "rate", r,
                "ceil", r, "quantum", "65536"])
        sh(["tc", "filter", "add", *dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
            "match", "ip", "sport", str(port), "0xffff", "flowid", "1:2"])
        yield
    finally:
        sh(["tc", "qdisc", "del", *dev, "root"], check=False)


def random_model(root, size, seed):
    """A model directory of random (non-dedupable) bytes: model.bin (@size
    bytes, stored in CHUNK-sized shards) and a small config.json."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    random_file(root / "model.bin", size, seed=seed)
    (root / "config.json").write_text(json.dumps({"seed": seed, "size": size}) + "\n")
    return root


def assert_identical(src, node, version):
    """MOUNT/versions/VERSION holds exactly @src's files, byte for byte (cmp)."""
    dst = node.vpath(version)
    want = sorted(os.listdir(src))
    got = sorted(e for e in os.listdir(dst) if e not in ("tensors", "tp"))  # computed views
    assert got == want, f"{node.name}: {version} holds {got}, the source {want}"
    for name in want:
        cp = sh(["cmp", os.path.join(src, name), os.path.join(dst, name)], check=False, timeout=120)
        assert cp.returncode == 0, f"{node.name}: {version}/{name} differs from the source: {cp.stdout}{cp.stderr}"


def corrupt_at(node, src_file, offset, what):
    """Flip a byte in every copy, in @node's arena, of the 4 KiB of @src_file at @offset
    (@what names them when none is found).  Returns the number of copies."""
    with open(src_file, "rb") as f:
        f.seek(offset)
        needle = f.read(4096)
    arena = os.path.join(node.store, "arena")
    hits = find_all(arena, needle)
    assert hits, f"could not find {what} in {node.name}'s {arena}"
    for off in hits:
        flip_byte(arena, off + 1000)
    return len(hits)


def corrupt_chunk(node, src_file, index):
    """Flip a byte of shard @index (CHUNK-sized pieces) of @src_file in @node's arena."""
    return corrupt_at(node, src_file, index * CHUNK + CHUNK // 2, f"chunk {index} of {src_file}")


def ring(net, names, **coord_kw):
    """Coordinator plus nodes @names, each started once the previous one is alive."""
    net.start_coord(**coord_kw)
    for name in names:
        net.add(name)
    return net.wait_alive(names, viewer=net[names[0]])


# --------------------------------------------------------------------------
# a rogue peer: a raw ZeroMQ DEALER speaking the wire format of docs/protocol.md


class Rogue:
    """A DEALER with routing id @identity connected to @url (CURVE with the key
    pair of key dir @keys and the server key @server_key when given).  It is not
    an hwfs node: it sends whatever message it is told to."""

    def __init__(self, url, identity, keys=None, server_key=None):
        import zmq
        self.zmq = zmq
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTING_ID, identity.encode())
        if keys:
            with open(os.path.join(keys, "key")) as f:
                public, secret = f.read().split()[:2]
            self.sock.curve_publickey = public.encode()
            self.sock.curve_secretkey = secret.encode()
            self.sock.curve_serverkey = server_key.encode()
        self.sock.connect(url)

    def send(self, t, payload=None, **fields):
        hdr = json.dumps({"v": 2, "t": t, **fields}, separators=(",", ":")).encode()
        self.sock.send_multipart([hdr] + ([payload] if payload is not None else []))

    def received(self, timeout_ms=0):
        """Every message waiting (headers as dicts), after up to @timeout_ms for the first."""
        out = []
        while self.sock.poll(timeout_ms if not out else 0):
            out.append(json.loads(self.sock.recv_multipart()[0]))
        return out

    def close(self):
        self.sock.close(0)
        self.ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
