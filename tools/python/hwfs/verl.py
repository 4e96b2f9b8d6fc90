"""hwfs.verl — a verl checkpoint engine that moves the actor's weights through an hwfs mount.

verl (https://github.com/volcengine/verl) hands the actor's weights to its
rollout servers through a *checkpoint engine*: the actor workers call
`send_weights(generator of (name, tensor), global_steps)`, every rollout
worker calls `receive_weights(global_steps)` and feeds the (name, tensor)
pairs it yields to its server adapter (vLLM's or SGLang's `update_weights`).
The built-in engines (nccl, nixl, hccl, ...) stream buckets over a
collective.  This one, registered in verl's `CheckpointEngineRegistry` as
"hwfs", uses the hwfs mount as the rendezvous instead:

* **send** (actor side, every rank of the actor's process group): the
  tensors are gathered into a state dict (each moved to the CPU as it comes,
  so that a full tensor made on a GPU does not stay there) and published with
  `hwfs.torch.publish` as the sealed version `step-<global_steps>`
  (`version_format`).  The store is content addressed, tensor by tensor: a
  tensor that did not change since the previous step costs nothing, a
  changed one one new shard.  With `commit=True` rank 0 then runs
  `hwfs commit VERSION` (the node's `current`, and its registered engines,
  follow).
* **receive** (rollout side): waits until that version is sealed on the
  worker's node (an event stream from the daemon, no polling loop), maps it
  read-only and yields every tensor as a zero-copy CPU tensor over the
  daemon's arena (copied to `device` when one is given).  The server adapter
  copies them into its model, as it does with every engine's tensors; the
  mapping is dropped at `finalize()`.

Select it in a verl config (the module is imported on every worker before the
engine is built, which registers it):

    actor_rollout_ref.rollout.checkpoint_engine.backend=hwfs
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=hwfs.verl
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.hwfs.mount=/hotweights

Engine keyword arguments (`engine_kwargs.hwfs.*`): see HwfsCheckpointEngine.
Importing this module imports verl and torch, not vLLM.
"""

import asyncio
import socket
import subprocess
import time

import torch.distributed as dist

import hwfs
import hwfs.torch
from hwfs.trainers import DEFAULT_MAX_FILE_BYTES, publish
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

__all__ = ["HwfsCheckpointEngine", "BACKEND"]

BACKEND = "hwfs"

# How long one wait for the version's arrival lasts before the deadline is
# looked at again (the wait ends at once when the event comes).
_WAIT_SLICE_S = 1.0


@CheckpointEngineRegistry.register(BACKEND)
class HwfsCheckpointEngine(CheckpointEngine):
    """verl checkpoint engine "hwfs": weights go through versions of an hwfs mount.

    Built by verl as `CheckpointEngineRegistry.new("hwfs", bucket_size=...,
    [is_master=...], **engine_kwargs["hwfs"])`.  Keyword arguments:

    * mount: the hwfs mount point (None: $HWFS_MOUNT, else /hotweights).  The
      actor's ranks must all write into one node's mount; a rollout worker
      reads its own node's (replication brings the version there).
    * version_format: the version's name, `str.format`ted with global_steps
      (default "step-{global_steps}").  When verl passes no global_steps the
      engine counts its updates (1, 2, ...) on both sides instead.  A name
      that exists already is refused by publish (a restarted run publishes
      under another format, e.g. "run2-step-{global_steps}").
    * commit: after publishing, rank 0 runs `hwfs commit VERSION` (default
      False); hwfs_bin is the `hwfs` program to run for that (default "hwfs").
    * files: extra files for the version (rank 0's), `{relative path: bytes,
      str, or os.PathLike to copy}`, e.g. config.json and the tokenizer, so
      that the version is a checkpoint vLLM or SGLang can load from disk.
    * max_file_bytes: above this much tensor data the version is split in
      several safetensors files (default 4 GiB).
    * wait_timeout_s: how long receive_weights waits for the version to be
      sealed on this node (default 600).
    * device: where received tensors go (default None: zero-copy CPU tensors
      over the mount's arena, read-only).
    * bucket_size, is_master: what verl passes to every engine; unused (the
      version is published whole, by every rank of the actor's group).
    """

    wire_format = "named_tensors"

    def __init__(self, bucket_size=None, is_master=False, mount=None,
                 version_format="step-{global_steps}", commit=False, hwfs_bin="hwfs",
                 files=None, max_file_bytes=DEFAULT_MAX_FILE_BYTES, wait_timeout_s=600.0,
                 device=None):
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.mount = hwfs.open(mount)
        self.version_format = version_format
        self.commit = bool(commit)
        self.hwfs_bin = hwfs_bin
        self.files = dict(files or {})
        self.max_file_bytes = int(max_file_bytes)
        self.wait_timeout_s = float(wait_timeout_s)
        self.device = device
        self._updates = 0      # send/receive calls so far (names when global_steps is None)
        self._mapping = None   # the version the last receive_weights mapped
        self.last_version = None

    # -- verl's topology hooks: the mount is the rendezvous, nothing to connect
    def prepare(self):
        """Metadata for verl's manager: this worker's node and mount."""
        return {"node": socket.gethostname(), "mount": self.mount.mountpoint}

    @classmethod
    def build_topology(cls, actor_wg_world_size, rollout_world_size, metadata):
        """No process group between actor and rollout: empty keyword lists."""
        return {}, {}

    def init_process_group(self, **kwargs):
        """Nothing to join (see build_topology)."""

    def finalize(self):
        """Drop the mapping of the last received version (its pages stay
        while a tensor made from it is alive)."""
        if self._mapping is not None:
            self._mapping.close()
            self._mapping = None

    # -- names
    def version_name(self, global_steps=None):
        """The version an update of @global_steps goes through (counts the call)."""
        self._updates += 1
        steps = self._updates if global_steps is None else int(global_steps)
        return self.version_format.format(global_steps=steps)

    # -- actor side
    async def send_weights(self, weights, global_steps=None):
        """Publish @weights ((name, tensor) pairs, a generator or an async one)
        as version `version_format(global_steps)`: a collective over the
        default process group (every actor rank calls it, as verl does).
        Returns verl metrics (a dict of numbers)."""
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("hwfs checkpoint engine: send_weights needs torch.distributed "
                               "initialised (verl's actor workers are)")
        version = self.version_name(global_steps)
        state = {}
        nbytes = 0
        async for name, tensor in ensure_async_iterator(weights):
            t = tensor.detach()
            if t.device.type != "cpu" and not _is_dtensor(t):
                t = t.to("cpu")
            state[name] = t
            nbytes += t.numel() * t.element_size()
        t0 = time.monotonic()
        publish(state, version, self.mount, files=self.files, max_file_bytes=self.max_file_bytes)
        publish_s = time.monotonic() - t0
        if self.commit and dist.get_rank() == 0:
            cp = subprocess.run([self.hwfs_bin, "commit", version, "-m", self.mount.mountpoint],
                                capture_output=True, text=True)
            if cp.returncode != 0:
                raise RuntimeError(f"hwfs commit {version} failed ({cp.returncode}): "
                                   f"{cp.stderr.strip() or cp.stdout.strip()}")
        self.last_version = version
        return {"hwfs/publish_s": publish_s, "hwfs/tensor_bytes": nbytes}

    # -- rollout side
    async def receive_weights(self, global_steps=None):
        """Yield (name, tensor) for every tensor of version
        `version_format(global_steps)`, once it is sealed on this node."""
        version = self.version_name(global_steps)
        mapping = await asyncio.to_thread(self._wait_and_map, version)
        self.finalize()
        self._mapping = mapping
        self.last_version = version
        for name, t in hwfs.torch.tensors(mapping).items():
            yield name, (t if self.device is None else t.to(self.device))

    def _sealed(self, version):
        for v in self.mount.versions():
            if v.name == version:
                if v.state == "damaged":
                    raise OSError(f"hwfs checkpoint engine: version {version} on "
                                  f"{self.mount.mountpoint} is damaged")
                return v.state == "sealed"
        return False

    def _wait_and_map(self, version):
        """Map @version once it is sealed here: a watch first (so that its
        arrival cannot be missed), then the list, then the events."""
        deadline = time.monotonic() + self.wait_timeout_s
        with self.mount.watch() as w:
            while not self._sealed(version):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"hwfs checkpoint engine: version {version} did not "
                                       f"arrive on {self.mount.mountpoint} within "
                                       f"{self.wait_timeout_s:g}s")
                w.next(timeout=min(left, _WAIT_SLICE_S))  # any event: look again
        return self.mount.map(version)


def _is_dtensor(t):
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(t, DTensor)

