"""hwfs.trl — TRL's async GRPO trainer syncing its weights through hwfs.

TRL 1.16's `trl.experimental.async_grpo.AsyncGRPOTrainer` takes a
`weight_transfer=` object with five methods (its `WeightTransferProtocol`):
`init_weight_transfer()` once at train begin, then at every sync `pause()`,
`send_weights(iterator)` with `(name, tensor)` pairs of the trainable
parameters (full tensors, already gathered by TRL, on the main process only),
`resume()`, and `destroy()` at train end.  `HwfsWeightTransfer` implements it:

    from hwfs.trl import HwfsWeightTransfer
    wt = HwfsWeightTransfer("/hotweights", servers=["http://127.0.0.1:8000"])
    trainer = AsyncGRPOTrainer(model=..., args=cfg, weight_transfer=wt, ...)

* `init_weight_transfer` waits for each vLLM server and calls its
  `/init_weight_transfer_engine` with `{"mount", "engine"}`: the servers run
  vLLM's native weight-transfer backend "hwfs" (started with
  `--load-format hwfs --weight-transfer-config '{"backend":"hwfs"}'`,
  docs/engines.md, "vLLM's native weight-transfer API").
* `send_weights` publishes the tensors as a new version `step-NNNNNN` of the
  mount with `hwfs.torch.publish` (the daemon stores content-addressed
  shards, so a tensor whose bytes did not change since the last version is
  not stored again, and a cluster node receives only the changed bytes).
  Tensors TRL does not send (frozen parameters: TRL sends only those with
  `requires_grad`) are taken from the previous version, zero-copy, so that
  every version is a whole checkpoint vLLM can load.  Then each server is
  driven through the native routes: `/start_weight_update`,
  `/update_weights {"version": V}`, `/finish_weight_update {"weight_version": V}`.
  With `commit=True` it runs `hwfs commit V` instead: a cluster-wide commit
  whose engine barrier makes every registered server (on every node) load V
  before `current` flips, and swap when it does.
* `pause` / `resume` call each server's `/pause?mode=keep` and `/resume`, as
  TRL's own NCCL client does.

The step number in the version name is the count of syncs (0 for the cold
sync at train begin), or `step_fn()` when given (e.g. `lambda:
trainer.state.global_step`).  `torch.distributed` need not be initialized:
a single-process trainer publishes alone (`publish` needs no group then).
With `commit=True`, the sync returns once every server reports the new
version (`GET /weight_info`): a commit returns when `current` flipped on
every node, and each server swaps as its node's flip reaches it, so
`resume` after that never lets a request start on the old weights and end
on the new.  In a multi-process trainer TRL
calls `send_weights` on the main process only, which `publish` (a
collective) cannot serve: the adapter refuses it at `init_weight_transfer`.

Every sync's figures are kept in `HwfsWeightTransfer.history` (one dict per
sync: version, publish_s, sync_s, commit_s (with commit=True, the `hwfs
commit` call within sync_s; else sync_s), pause_s).
"""

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request

import hwfs

__all__ = ["HwfsWeightTransfer", "SyncError"]

DEFAULT_FORMAT = "step-{:06d}"


class SyncError(RuntimeError):
    """A server refused a step of the sync, or the commit failed (the message
    says which server, route and answer)."""


def _post(url, body=None, timeout=300.0):
    data = json.dumps(body if body is not None else {}).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


class HwfsWeightTransfer:
    """TRL's `WeightTransferProtocol` over hwfs (see the module docstring).

    @mount: the hwfs mount the trainer publishes to (a path; None:
    $HWFS_MOUNT, else /hotweights).  @servers: the vLLM servers' base URLs,
    or (URL, the mount of its node) for a server on another node of the
    cluster (use @commit then: the commit waits for the version there).
    @engine: the engine name the servers register on their node (None: the
    servers' own, `HWFS_ENGINE` or the default).  @files: other files put in
    every version ({relative path: bytes, str or a path to copy}, as
    `hwfs.torch.publish`), e.g. config.json.  @base: the version whose
    tensors fill in those TRL does not send at the first sync (None: the
    mount's `current`).  @commit: swap by `hwfs commit V` instead of the
    routes.  @version_format: the version name from the step number.
    @step_fn: the step number (None: the count of syncs).  @pause_mode: the
    `/pause` mode ("keep": in-flight requests wait and go on with the new
    weights, as TRL's client does; "wait": they finish first; "abort").
    @timeout: seconds per HTTP call, and for the servers' swaps after a
    commit."""

    def __init__(self, mount=None, servers=(), *, engine=None, files=None, base=None,
                 commit=False, version_format=DEFAULT_FORMAT, step_fn=None,
                 pause_mode="keep", timeout=300.0):
        self.mount_path = mount or os.environ.get("HWFS_MOUNT") or "/hotweights"
        servers = [servers] if isinstance(servers, str) else list(servers)
        # (url, the mount of the server's node) or a url (the server is on @mount's node)
        self.server_mounts = {}
        self.servers = []
        for s in servers:
            url, m = (s, None) if isinstance(s, str) else s
            self.servers.append(url.rstrip("/"))
            self.server_mounts[url.rstrip("/")] = m or self.mount_path
        self.engine = engine
        self.files = files
        self.base = base
        self.commit = commit
        self.version_format = version_format
        self.step_fn = step_fn
        self.pause_mode = pause_mode
        self.timeout = timeout
        self.syncs = 0
        self.last_version = None
        self.history = []
        self._mnt = None
        self._paused_at = None
        self.swap_started = None  # perf_counter when the last swap (routes or commit) began

    # -- TRL's WeightTransferProtocol
    def init_weight_transfer(self):
        """Open the mount, check the process group, and init every server's
        "hwfs" backend (waiting for each server's /health first)."""
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            if dist.get_world_size() != 1:
                raise RuntimeError(
                    "hwfs.trl: TRL calls send_weights on the main process only, and "
                    "hwfs.torch.publish is a collective of every rank: a multi-process trainer "
                    "cannot publish through this adapter (docs/engines.md, \"TRL\")")
        self._mnt = hwfs.open(self.mount_path)
        if self.base is None:
            self.base = self._mnt.current()
        for url in self.servers:
            self._wait_up(url)
            self._call(url, "/init_weight_transfer_engine",
                       {"init_info": {"mount": self.server_mounts[url], "engine": self.engine}})

    def pause(self):
        """Pause every server (`/pause?mode=@pause_mode`)."""
        self._paused_at = time.perf_counter()
        for url in self.servers:
            self._call(url, "/pause?mode=" + urllib.parse.quote(self.pause_mode))

    def send_weights(self, iterator):
        """Publish the (name, tensor) pairs of @iterator as the next version and
        make every server serve it (routes, or `hwfs commit`)."""
        from hwfs.torch import publish
        if self._mnt is None:
            raise RuntimeError("hwfs.trl: send_weights before init_weight_transfer")
        step = self.step_fn() if self.step_fn is not None else self.syncs
        version = self.version_format.format(step)
        state = {name: t.detach() for name, t in iterator}
        filled = self._fill(state)
        t0 = time.perf_counter()
        try:
            publish(state, version, self._mnt, files=self.files)
        finally:
            if filled is not None:
                filled.close()
        t1 = time.perf_counter()
        self.swap_started = t1
        if self.commit:
            # a node the version has not reached yet answers the commit's
            # PREPARE once it arrived (within the commit's deadline)
            r = self._mnt.call({"op": "commit", "version": version})
            if not r.get("ok"):
                raise SyncError(f"hwfs commit {version} failed: {r.get('error') or r}")
            t_committed = time.perf_counter()
            end = time.monotonic() + self.timeout
            for url in self.servers:  # each swaps as its node's flip reaches it
                while self._weight_version(url) != version:
                    if time.monotonic() > end:
                        raise SyncError(f"{url} does not serve {version} "
                                        f"{self.timeout:.0f} s after its commit")
                    time.sleep(0.005)
        else:
            for url in self.servers:
                self._call(url, "/start_weight_update", {"is_checkpoint_format": True})
                try:
                    self._call(url, "/update_weights", {"update_info": {"version": version}})
                except SyncError:
                    _post(url + "/finish_weight_update", {}, self.timeout)  # ends the session
                    raise
                self._call(url, "/finish_weight_update", {"weight_version": version})
        t2 = time.perf_counter()
        if not self.commit:
            t_committed = t2
        self.syncs += 1
        self.last_version = version
        self.history.append({"version": version, "tensors": len(state), "publish_s": t1 - t0,
                             "sync_s": t2 - t1, "commit_s": t_committed - t1,
                             "pause_s": None})

    def resume(self):
        """Resume every server."""
        for url in self.servers:
            self._call(url, "/resume")
        if self._paused_at is not None and self.history and self.history[-1]["pause_s"] is None:
            self.history[-1]["pause_s"] = time.perf_counter() - self._paused_at
        self._paused_at = None

    def destroy(self):
        """Close the mount.  The servers keep serving the last version."""
        if self._mnt is not None:
            self._mnt.close()
            self._mnt = None

    # -- helpers
    def _fill(self, state):
        """Add to @state the tensors of the previous version (or @base) that
        TRL did not send; the mapping they come from (closed after publish),
        or None."""
        prev = self.last_version or self.base
        if prev is None:
            return None
        mp = self._mnt.map(prev)
        from hwfs.torch import tensors
        missing = [k for k in mp.keys() if k not in state]
        if not missing:
            mp.close()
            return None
        t = tensors(mp)
        for k in missing:
            state[k] = t[k]
        return mp

    def _wait_up(self, url):
        end = time.monotonic() + self.timeout
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > end:
                raise SyncError(f"vLLM server {url} not up within {self.timeout:.0f} s")
            time.sleep(0.5)

    def _weight_version(self, url):
        """The version @url serves (its GET /weight_info)."""
        try:
            with urllib.request.urlopen(url + "/weight_info", timeout=self.timeout) as r:
                return json.loads(r.read()).get("weight_version")
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise SyncError(f"{url}/weight_info: {e}") from None

    def _call(self, url, route, body=None):
        code, text = _post(url + route, body, self.timeout)
        if code != 200:
            raise SyncError(f"{url}{route}: HTTP {code}: {text[:2000]}")
        return text
