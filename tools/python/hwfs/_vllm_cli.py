"""hwfs-vllm: a vLLM server as an hwfs engine (docs/engines.md, "hwfs-vllm").

    hwfs-vllm --server http://127.0.0.1:8000 --engine vllm-0 [-m /hotweights]
              [--inflight wait|abort] [--drain-timeout S] [--low-memory]

A server started with the weight-transfer backend "hwfs"
(--weight-transfer-config '{"backend": "hwfs"}', hwfs.vllm_native) does the
loading itself; hwfs-vllm is then a thin driver of it (NativeDriver): it
registers the server as engine NAME through /init_weight_transfer_engine
({"flip": "driver"}: the workers shadow-load what arrives or a commit
prepares, and report it), and at each flip of `current` holds the requests
(/pause, --inflight), drives the swap through vLLM's routes (start, update
{"version"}, finish) and resumes: no answer mixes two versions.

A server started instead with VLLM_SERVER_DEV_MODE=1 and
--worker-extension-cls hwfs.vllm.WorkerExtension (no backend) is driven
through /collective_rpc (Engine, below).  hwfs-vllm registers NAME
in the node's commit barrier, shadow-loads each arriving (or prepared)
version into the workers through /collective_rpc, a slice per call, reports
it loaded or refused, and at the flip holds new requests (/pause), lets
those in flight finish on the old weights (--inflight wait) or aborts them
(abort), swaps every worker's parameters in one call, and resumes (/resume,
on every path).  It brings the server to `current` when it starts, and
registers again when the server comes back after a restart.
"""

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request

import hwfs

PROG = "hwfs-vllm"


class ServerGone(Exception):
    """The vLLM server does not answer."""


class RpcError(Exception):
    """A worker answered {"ok": false}."""


def log(msg):
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


class Server:
    def __init__(self, url, rpc_timeout):
        self.url = url.rstrip("/")
        self.rpc_timeout = rpc_timeout

    def _req(self, method, path, body=None, timeout=30.0):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace").strip().replace("\n", " ")[:300]
            if e.code == 404:
                raise RpcError(f"{path}: 404 (is VLLM_SERVER_DEV_MODE=1 set on the server?)") \
                    from None
            raise RpcError(f"{path}: HTTP {e.code}: {text}") from None
        except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ServerGone(f"vLLM server {self.url} does not answer ({reason})") from None
        return json.loads(raw) if raw else {}

    def healthy(self):
        try:
            self._req("GET", "/health", timeout=5.0)
            return True
        except (ServerGone, RpcError):
            return False

    def rpc(self, method, **req):
        """Run WorkerExtension.@method on every worker: the list of results."""
        out = self._req("POST", "/collective_rpc",
                        {"method": method, "args": [json.dumps(req)], "timeout": self.rpc_timeout},
                        timeout=self.rpc_timeout + 10)
        results = out.get("results") or []
        if not results:
            raise RpcError(f"{method}: no worker answered")
        for r in results:
            if not isinstance(r, dict):
                raise RpcError(f"{method}: unexpected answer {str(r)[:200]} (is the server "
                               f"started with --worker-extension-cls hwfs.vllm.WorkerExtension?)")
            if not r.get("ok"):
                raise RpcError(r.get("error") or f"{method} failed")
        return results

    def pause(self, mode, timeout):
        self._req("POST", f"/pause?mode={mode}", timeout=timeout)

    def resume(self):
        self._req("POST", "/resume", timeout=30.0)

    @contextlib.contextmanager
    def held(self, mode, drain_timeout):
        """New requests held around the body (/pause?mode=@mode; "wait"
        aborts what still runs after @drain_timeout seconds), /resume on
        every path, a failed pause included."""
        try:
            try:
                self.pause(mode, timeout=drain_timeout)
            except ServerGone as e:
                if "timed out" not in str(e) or mode == "abort":
                    raise
                log(f"requests in flight still running after {drain_timeout} s: aborting them")
                self.pause("abort", timeout=30.0)
            yield
        finally:
            try:
                self.resume()
            except (ServerGone, RpcError) as e:
                log(f"cannot resume the server: {e}")


def write_status_file(path, stats):
    """@stats as JSON in @path (None: nowhere), replaced atomically."""
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(stats, f)
        os.replace(tmp, path)


class Engine:
    def __init__(self, args):
        self.args = args
        self.server = Server(args.server, args.rpc_timeout)
        self.mount = hwfs.open(args.mount)
        self.mnt = self.mount.mountpoint
        self.watch = None
        self.served = None
        self.attached = False  # hwfs_attach ran on this server
        self.loaded = None     # the version whose shadow is loaded in the workers
        self.stats = {}
        self.native = None     # the server runs the backend "hwfs" (None: not known yet)

    # -- status for people and tests
    def write_status(self, **kw):
        self.stats.update(kw, engine=self.args.engine, served=self.served, shadow=self.loaded,
                          time=time.time())
        write_status_file(self.args.status_file, self.stats)

    def report(self, what, version, reason=None, pause_us=0, **split):
        try:
            self.watch.report(what, version, reason=reason, pause_us=pause_us, **split)
        except (OSError, ValueError) as e:
            log(f"cannot report {what} {version}: {e}")

    # -- shadow-load and swap
    def shadow_load(self, v):
        """Load @v beside the served version; True when loaded (reported)."""
        if not self.attached:  # nothing committed yet: the commit attaches (loads) @v
            self.loaded = v
            self.report("loaded", v)
            log(f"{v}: nothing served from the mount yet; the commit will load it")
            return True
        self.report("loading", v)
        self.write_status(state="loading", loading=v)
        t0 = time.monotonic()
        try:
            r = self.server.rpc("hwfs_prepare", mount=self.mnt, version=v,
                                low_memory=self.args.low_memory)
            self.loaded = None
            # loaded at once: every worker still had @v as its standby (a commit back)
            if not self.args.low_memory and not all(x.get("loaded") for x in r):
                while True:
                    r = self.server.rpc("hwfs_load_slice", slice_bytes=self.args.slice_mib << 20)
                    if all(x.get("left", 0) == 0 for x in r):
                        break
                    if self.args.slice_pause:
                        time.sleep(self.args.slice_pause)
        except RpcError as e:
            self.report("refused", v, reason=str(e))
            self.write_status(state="refused", reason=str(e))
            log(f"refused {v}: {e}")
            return False
        except ServerGone as e:
            self.report("refused", v, reason=f"cannot load {v}: {e}")
            raise
        self.loaded = v
        load_s = time.monotonic() - t0
        self.report("loaded", v)
        self.write_status(state="loaded", reason=None, last_load_s=round(load_s, 3))
        log(f"loaded {v} beside {self.served} in {load_s:.2f} s")
        return True

    def swap(self, v):
        """Serve @v: hold new requests, drain or abort those in flight, swap, resume."""
        mode = self.args.inflight
        at = time.time()
        t0 = time.monotonic_ns()
        try:
            with self.server.held(mode, self.args.drain_timeout):
                drained = time.monotonic_ns()
                if not self.attached:
                    r = self.server.rpc("hwfs_attach", mount=self.mnt, version=v)
                    self.attached = True
                elif self.args.low_memory:
                    r = self.server.rpc("hwfs_load_inplace", mount=self.mnt, version=v)
                else:
                    r = self.server.rpc("hwfs_swap", version=v, copy=self.args.copy_swap)
                swap_us = max(int(x.get("swap_us") or round(x.get("load_s", 0) * 1e6) or 1)
                              for x in r)
        except RpcError as e:
            log(f"swap to {v} failed: {e}; still serving {self.served}")
            self.write_status(state="swap-failed", reason=str(e))
            return False
        t3 = time.monotonic_ns()
        pause_us = max(1, (t3 - t0) // 1000)
        drain_us = (drained - t0) // 1000
        self.served, self.loaded = v, None
        self.report("swapped", v, pause_us=pause_us, drain_us=drain_us, swap_us=swap_us)
        self.write_status(state="idle", last_swap_pause_us=pause_us, last_drain_us=drain_us,
                          last_swap_us=swap_us, swaps=self.stats.get("swaps", 0) + 1,
                          last_pause_at=at, last_resume_at=at + (t3 - t0) / 1e9)
        log(f"serving {v} (paused {pause_us / 1000:.1f} ms: drain {drain_us / 1000:.1f} ms, "
            f"swap {swap_us / 1000:.3f} ms)")
        return True

    def bring_to(self, v):
        if v is None or v == self.served:
            return
        if self.loaded == v or self.shadow_load(v):
            self.swap(v)

    def on_event(self, ev):
        v = ev.version
        if ev.type in ("arrived", "prepare"):
            if v == self.served:
                return
            if v == self.loaded:
                self.report("loaded", v)
                return
            self.shadow_load(v)
        elif ev.type == "current":
            if v != self.served:
                if self.loaded != v and not self.shadow_load(v):
                    log(f"current is {v}, which does not fit: still serving {self.served}")
                    return
                self.swap(v)
        elif ev.type == "removed" and v == self.loaded:
            self.loaded = None
            try:
                self.server.rpc("hwfs_cancel")
            except RpcError:
                pass

    # -- one life of the server
    def session(self):
        self.watch = self.mount.watch(engine=self.args.engine)
        try:
            cur = self.watch.current
            r = self.server.rpc("hwfs_attach", mount=self.mnt, version=cur) if cur else None
            if r is None:  # nothing committed: attached by an earlier hwfs-vllm?
                st = self.server.rpc("hwfs_status")[0]
                self.attached, self.served = bool(st.get("attached")), st.get("served")
            if r is not None:
                self.served, self.loaded, self.attached = r[0].get("served"), None, True
                if r[0].get("attached"):
                    log(f"attached to {self.server.url} ({len(r)} worker(s)), serving {cur}")
                    self.report("swapped", cur, pause_us=0)
                else:
                    log(f"{self.server.url} serves {self.served} (attached before)")
                    if self.served == cur:
                        self.report("swapped", cur, pause_us=0)
                    else:
                        self.bring_to(cur)
            self.write_status(state="idle")
            last_check = time.monotonic()
            while not STOP:
                try:
                    ev = self.watch.next(timeout=0.5)
                except hwfs.StreamClosed:
                    raise SystemExit(f"{PROG}: the hwfs daemon closed the engine stream")
                if ev is not None:
                    self.on_event(ev)
                if time.monotonic() - last_check > self.args.check_interval:
                    last_check = time.monotonic()
                    st = self.server.rpc("hwfs_status")
                    if not st[0].get("attached"):  # restarted between two checks
                        raise ServerGone(f"{self.server.url} restarted")
        finally:
            w, self.watch = self.watch, None
            w.close()


class NativeDriver:
    """hwfs-vllm on a server whose workers run the backend "hwfs": the
    backend loads and reports; this holds the requests around each swap."""

    def __init__(self, args, server, mount):
        self.args, self.server, self.mount = args, server, mount
        self.mnt = mount.mountpoint
        self.served = None
        self.stats = {}

    def init(self):
        """Register the server as engine NAME, the swaps left to us.  False
        when the server has no backend "hwfs" (the legacy driver then)."""
        body = {"init_info": {"mount": self.mnt, "engine": self.args.engine, "flip": "driver"}}
        try:
            self.server._req("POST", "/init_weight_transfer_engine", body, timeout=60.0)
        except RpcError as e:
            log(f"no weight-transfer backend \"hwfs\" on {self.server.url} ({e}); "
                f"driving its workers through /collective_rpc")
            return False
        return True

    def record(self):
        """The engine's record in the node's status (its first worker's)."""
        st = self.mount.call({"op": "status"})
        for e in st.get("engines") or []:
            if e.get("name") in (self.args.engine, self.args.engine + ".rank0"):
                return e
        return None

    def write_status(self, **kw):
        self.stats.update(kw, engine=self.args.engine, served=self.served, driver="native",
                          time=time.time())
        write_status_file(self.args.status_file, self.stats)

    def swap(self, v):
        """Serve @v: hold new requests, drain or abort those in flight, then
        start, update {"version": v}, finish; resume on every path."""
        t0 = time.monotonic_ns()
        update = {"version": v}
        if self.args.low_memory:
            update["mode"] = "in_place"
        try:
            with self.server.held(self.args.inflight, self.args.drain_timeout):
                drained = time.monotonic_ns()
                self.server._req("POST", "/start_weight_update", {}, timeout=60.0)
                self.server._req("POST", "/update_weights", {"update_info": update},
                                 timeout=self.args.rpc_timeout)
                self.server._req("POST", "/finish_weight_update", {},
                                 timeout=self.args.rpc_timeout)
        except RpcError as e:
            log(f"swap to {v} failed: {e}; still serving {self.served}")
            self.write_status(state="swap-failed", reason=str(e))
            return False
        t1 = time.monotonic_ns()
        pause_us, drain_us = max(1, (t1 - t0) // 1000), (drained - t0) // 1000
        self.served = v
        self.write_status(state="idle", reason=None, last_swap_pause_us=pause_us,
                          last_drain_us=drain_us, swaps=self.stats.get("swaps", 0) + 1)
        log(f"serving {v} (requests held {pause_us / 1000:.1f} ms: drain "
            f"{drain_us / 1000:.1f} ms)")
        return True

    def session(self):
        """One life of the server: False when it has no backend "hwfs"."""
        watch = self.mount.watch()  # an observer: the workers are the engine
        try:
            if not self.init():
                return False
            rec = self.record() or {}
            self.served = rec.get("serving")
            log(f"{self.server.url} runs the backend \"hwfs\", serving {self.served}: "
                f"each flip of current is swapped through vLLM's routes")
            cur = watch.current
            if cur and cur != self.served:
                self.swap(cur)
            self.write_status(state="idle")
            last_check = time.monotonic()
            while not STOP:
                try:
                    ev = watch.next(timeout=0.5)
                except hwfs.StreamClosed:
                    raise SystemExit(f"{PROG}: the hwfs daemon closed the event stream")
                if ev is not None and ev.type == "current" and ev.version != self.served:
                    self.swap(ev.version)
                if time.monotonic() - last_check > self.args.check_interval:
                    last_check = time.monotonic()
                    if not self.server.healthy():
                        raise ServerGone(f"{self.server.url} does not answer")
                    if self.record() is None:  # restarted: registered no more
                        raise ServerGone(f"{self.server.url} restarted")
            return True
        finally:
            watch.close()


STOP = False


def _stop(signum, frame):
    global STOP
    STOP = True


def main(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True, help="the vLLM server, e.g. http://127.0.0.1:8000")
    p.add_argument("--engine", required=True, help="the engine name in the node's commit barrier")
    p.add_argument("-m", "--mount", default=None, help="the hwfs mount (default $HWFS_MOUNT, "
                   "else /hotweights)")
    p.add_argument("--inflight", choices=("wait", "abort"), default="wait",
                   help="requests running at the swap: finish on the old weights (wait) or abort")
    p.add_argument("--drain-timeout", type=float, default=60.0, metavar="S",
                   help="with --inflight wait: abort what still runs after S seconds (60)")
    p.add_argument("--low-memory", action="store_true",
                   help="no shadow copy: load at the commit, while requests are held "
                        "(the pause is the whole load)")
    p.add_argument("--copy-swap", action="store_true",
                   help="copy the shadow into the live storage instead of swapping pointers "
                        "(for CUDA graphs; the pause is three copies of the weights)")
    p.add_argument("--slice-mib", type=int, default=64,
                   help="MiB loaded per call between engine steps (64)")
    p.add_argument("--slice-pause", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--rpc-timeout", type=float, default=600.0, help=argparse.SUPPRESS)
    p.add_argument("--check-interval", type=float, default=2.0, help=argparse.SUPPRESS)
    p.add_argument("--status-file", default=None,
                   help="write the engine's state and last swap's timings (JSON) here")
    args = p.parse_args(argv)
    if args.slice_mib < 1:
        p.error("--slice-mib must be at least 1")
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        eng = Engine(args)
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    waiting_since = None
    while not STOP:
        if not eng.server.healthy():
            if waiting_since is None:
                waiting_since = time.monotonic()
                log(f"waiting for the vLLM server at {eng.server.url}")
            time.sleep(0.5)
            continue
        waiting_since = None
        try:
            if eng.native is None or eng.native:
                eng.native = NativeDriver(args, eng.server, eng.mount).session() and True
                if eng.native:
                    continue
            eng.session()
        except ServerGone as e:
            log(f"{e}: unregistered; waiting for it to come back")
            eng.served = eng.loaded = None
            eng.attached = False
            eng.write_status(state="no-server")
        except RpcError as e:
            log(f"error: {e}")
            eng.write_status(state="error", reason=str(e))
            time.sleep(2.0)
        except OSError as e:  # the mount: registration refused, ...
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
