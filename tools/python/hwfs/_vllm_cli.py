"""hwfs-vllm: the driver of a vLLM server with the backend "hwfs" (docs/engines.md, "hwfs-vllm").

    hwfs-vllm --server http://127.0.0.1:8000 --engine vllm-0 [-m /hotweights]
              [--inflight wait|abort] [--drain-timeout S] [--low-memory]
              [--copy-swap] [--slice-mib N] [--status-file F]

The server runs vLLM's weight-transfer backend "hwfs" (--weight-transfer-config
'{"backend": "hwfs"}', hwfs.vllm_native; --load-format hwfs for a zero-copy
first load), which does the loading: hwfs-vllm registers the server as engine
NAME through POST /init_weight_transfer_engine ({"flip": "driver"}: the
workers shadow-load what arrives or a commit prepares, report it, and leave
the swap at a flip of `current` to the driver), and at each flip holds the
requests (/pause, --inflight), drives the swap through vLLM's routes (start,
update {"version"}, finish) and resumes (/resume, on every path): no answer
mixes two versions.  It waits for a server that does not answer yet, brings
it to `current`, and registers it again when it restarts.  Stopped (SIGTERM,
SIGINT), it unregisters the server (/shutdown_weight_transfer_engine): no
commit waits for it, and it stays on the version it serves.

Exit status: 0 when stopped (SIGTERM, SIGINT); 1 on an error of the mount
or of the daemon; 2 on a usage error; 3 (NO_BACKEND) when the server runs
no backend "hwfs" (the message says what to add to its command line).
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
NO_BACKEND = 3
BACKEND_FLAGS = ("--weight-transfer-config '{\"backend\": \"hwfs\"}' (and --load-format hwfs "
                 "for a zero-copy first load)")


class ServerGone(Exception):
    """The vLLM server does not answer, or it restarted."""


class RouteError(Exception):
    """A route of the server answered an HTTP error."""

    def __init__(self, path, code, text):
        super().__init__(f"{path}: HTTP {code}: {text}")
        self.code, self.text = code, text


class NoBackend(Exception):
    """The server runs no weight-transfer backend "hwfs"."""


def log(msg):
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


class Server:
    def __init__(self, url):
        self.url = url.rstrip("/")

    def _req(self, method, path, body=None, timeout=30.0):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace").strip().replace("\n", " ")[:300]
            raise RouteError(path, e.code, text) from None
        except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ServerGone(f"vLLM server {self.url} does not answer ({reason})") from None
        return json.loads(raw) if raw else {}

    def post(self, path, body=None, timeout=30.0):
        return self._req("POST", path, {} if body is None else body, timeout)

    def healthy(self):
        try:
            self._req("GET", "/health", timeout=5.0)
            return True
        except (ServerGone, RouteError):
            return False

    @contextlib.contextmanager
    def held(self, mode, drain_timeout):
        """New requests held around the body (/pause?mode=@mode; "wait"
        aborts what still runs after @drain_timeout seconds), /resume on
        every path, a failed pause included."""
        try:
            try:
                self.post(f"/pause?mode={mode}", timeout=drain_timeout)
            except ServerGone as e:
                if "timed out" not in str(e) or mode == "abort":
                    raise
                log(f"requests in flight still running after {drain_timeout} s: aborting them")
                self.post("/pause?mode=abort")
            yield
        finally:
            try:
                self.post("/resume")
            except (ServerGone, RouteError) as e:
                log(f"cannot resume the server: {e}")


class Driver:
    """Registers the server's backend as engine NAME and holds the requests
    around each swap; the backend loads and reports."""

    def __init__(self, args):
        self.args = args
        self.server = Server(args.server)
        self.mount = hwfs.open(args.mount)
        self.mnt = self.mount.mountpoint
        self.served = None
        self.pid = None  # the registered worker's (rank 0's): another one is a restarted server
        self.stats = {}

    def init(self):
        """Register the server as engine NAME, the swaps left to us.  Raises
        NoBackend when the server has no backend "hwfs"."""
        info = {"mount": self.mnt, "engine": self.args.engine, "flip": "driver"}
        for key, value in (("mode", self.args.low_memory and "in_place"),
                           ("swap", self.args.copy_swap and "copy"),
                           ("slice_mib", self.args.slice_mib)):
            if value:  # only what differs from the defaults: an older backend takes the rest
                info[key] = value
        try:
            self.server.post("/init_weight_transfer_engine", {"init_info": info}, timeout=60.0)
        except RouteError as e:
            if e.code == 404:
                raise NoBackend(f"{self.server.url} has no route /init_weight_transfer_engine: "
                                f"start it with VLLM_SERVER_DEV_MODE=1 and {BACKEND_FLAGS}") \
                    from None
            if "HwfsWeightTransferEngine" not in e.text and "hwfs: " not in e.text:
                raise NoBackend(f"{self.server.url} runs no weight-transfer backend \"hwfs\" "
                                f"({e}): start it with {BACKEND_FLAGS}") from None
            raise

    def record(self):
        """The engine's record in the node's status (its first worker's)."""
        st = self.mount.call({"op": "status"})
        for e in st.get("engines") or []:
            if e.get("name") in (self.args.engine, self.args.engine + ".rank0"):
                return e
        return None

    def write_status(self, **kw):
        """The status file (--status-file): the driver's state and last swap
        beside the engine's record (shadow, state, reason, the workers' swap)."""
        self.stats.update(kw, engine=self.args.engine, served=self.served)
        if self.args.status_file:
            tmp = self.args.status_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(dict(self.stats, time=time.time()), f)
            os.replace(tmp, self.args.status_file)

    def refresh(self):
        """The engine's record into the status file (when it changed);
        ServerGone when the workers registered no more (the server died or
        restarted: a restarted one registers again as another process)."""
        rec = self.record()
        if rec is None or rec.get("pid") != self.pid:
            raise ServerGone(f"{self.server.url}'s workers are no longer registered "
                             f"(the server exited or restarted)")
        self.served = rec.get("serving")
        seen = {"state": rec.get("state"), "shadow": rec.get("shadow"),
                "reason": rec.get("reason"), "last_swap_us": rec.get("last_swap_us")}
        if any(self.stats.get(k) != v for k, v in seen.items()) or \
                self.stats.get("served") != self.served:
            self.write_status(**seen)

    def swap(self, v):
        """Serve @v: hold new requests, drain or abort those in flight, then
        start, update {"version": v}, finish; resume on every path."""
        update = {"version": v}
        if self.args.low_memory:
            update["mode"] = "in_place"
        at = time.time()
        t0 = time.monotonic_ns()
        try:
            with self.server.held(self.args.inflight, self.args.drain_timeout):
                drained = time.monotonic_ns()
                self.server.post("/start_weight_update", timeout=60.0)
                self.server.post("/update_weights", {"update_info": update},
                                 timeout=self.args.rpc_timeout)
                self.server.post("/finish_weight_update", timeout=self.args.rpc_timeout)
        except RouteError as e:
            log(f"swap to {v} failed: {e}; still serving {self.served}")
            self.write_status(error=str(e))
            return False
        t1 = time.monotonic_ns()
        pause_us, drain_us = max(1, (t1 - t0) // 1000), (drained - t0) // 1000
        self.served = v
        self.write_status(error=None, last_swap_pause_us=pause_us, last_drain_us=drain_us,
                          swaps=self.stats.get("swaps", 0) + 1, last_pause_at=at,
                          last_resume_at=at + (t1 - t0) / 1e9)
        log(f"serving {v} (requests held {pause_us / 1000:.1f} ms: drain "
            f"{drain_us / 1000:.1f} ms)")
        return True

    def session(self):
        """One life of the server."""
        watch = self.mount.watch()  # an observer: the workers are the engine
        try:
            self.init()
            rec = self.record() or {}
            self.served, self.pid = rec.get("serving"), rec.get("pid")
            log(f"{self.server.url} runs the backend \"hwfs\", serving {self.served}: "
                f"each flip of current is swapped through vLLM's routes")
            cur = watch.current
            if cur and cur != self.served:
                self.swap(cur)
            self.refresh()
            last_check = time.monotonic()
            while not STOP:
                try:
                    ev = watch.next(timeout=0.5)
                except hwfs.StreamClosed:
                    raise SystemExit(f"{PROG}: the hwfs daemon closed the event stream")
                if ev is not None and ev.type == "current" and ev.version != self.served:
                    self.swap(ev.version)
                self.refresh()
                if time.monotonic() - last_check > self.args.check_interval:
                    last_check = time.monotonic()
                    if not self.server.healthy():
                        raise ServerGone(f"{self.server.url} does not answer")
        finally:
            watch.close()

    def leave(self):
        """Unregister the server (stopping): no commit waits for a server
        whose swaps nobody drives."""
        if self.pid is None:
            return
        try:
            self.server.post("/shutdown_weight_transfer_engine")
            log(f"unregistered {self.server.url}; it goes on serving {self.served}")
        except (ServerGone, RouteError) as e:
            log(f"cannot unregister {self.server.url}: {e}")


STOP = False


def _stop(signum, frame):
    global STOP
    STOP = True


def main(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                epilog=f"Exit status {NO_BACKEND}: the server runs no backend "
                                       f"\"hwfs\" (start it with {BACKEND_FLAGS}).")
    p.add_argument("--server", required=True, help="the vLLM server, e.g. http://127.0.0.1:8000")
    p.add_argument("--engine", required=True, help="the engine name in the node's commit barrier")
    p.add_argument("-m", "--mount", default=None, help="the hwfs mount (default $HWFS_MOUNT, "
                   "else /hotweights)")
    p.add_argument("--inflight", choices=("wait", "abort"), default="wait",
                   help="requests running at the swap: finish on the old weights (wait) or abort")
    p.add_argument("--drain-timeout", type=float, default=60.0, metavar="S",
                   help="with --inflight wait: abort what still runs after S seconds (60)")
    p.add_argument("--low-memory", action="store_true",
                   help="no shadow copy: a version is only checked when it arrives, and loaded "
                        "at the commit, while requests are held (the pause is the whole load)")
    p.add_argument("--copy-swap", action="store_true",
                   help="copy the shadow into the live storage instead of swapping pointers "
                        "(for CUDA graphs; the pause is three copies of the weights)")
    p.add_argument("--slice-mib", type=float, default=None, metavar="N",
                   help="MiB the workers load per slice between forward passes (default: the "
                        "server's $HWFS_VLLM_SLICE_MIB, else 64)")
    p.add_argument("--rpc-timeout", type=float, default=600.0, help=argparse.SUPPRESS)
    p.add_argument("--check-interval", type=float, default=2.0, help=argparse.SUPPRESS)
    p.add_argument("--status-file", default=None,
                   help="write the engine's state and last swap's timings (JSON) here")
    args = p.parse_args(argv)
    if args.slice_mib is not None and not args.slice_mib > 0:
        p.error("--slice-mib must be above 0")
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        drv = Driver(args)
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    waiting = False
    while not STOP:
        if not drv.server.healthy():
            if not waiting:
                waiting = True
                log(f"waiting for the vLLM server at {drv.server.url}")
            time.sleep(0.5)
            continue
        waiting = False
        try:
            drv.session()
        except NoBackend as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            drv.write_status(state="no-backend", error=str(e))
            return NO_BACKEND
        except ServerGone as e:
            log(f"{e}: waiting for it to come back")
            drv.served = drv.pid = None
            drv.write_status(state="no-server")
        except RouteError as e:
            log(f"error: {e}")
            drv.write_status(error=str(e))
            time.sleep(2.0)
        except OSError as e:  # the mount
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 1
    drv.leave()
    return 0


if __name__ == "__main__":
    sys.exit(main())
