"""hwfs.trainers — trainers and hwfs: a sharded publish from every rank, and a
distributed swap at step boundaries (docs/trainers.md).  Both are re-exported
by hwfs.torch:

    from hwfs.torch import publish, TrainerSwap

    publish(model.state_dict(), "step-1000", "/hotweights")   # every rank calls it

publish() is a collective over a torch.distributed process group.  Every rank
of the group must see the same hwfs mount (one node: the ranks' file writes
all land in that node's daemon).  Plain tensors are taken as replicated and
written once, by one rank (the ranks share that work); a DTensor is written
shard by shard, each by the rank that owns it, straight into its byte ranges of
the full tensor in the checkpoint file: no rank ever holds more than its own
shards plus a bounded buffer.  The result is an ordinary Hugging Face style
checkpoint (one `model.safetensors`, or `model-0000i-of-0000n.safetensors` and
`model.safetensors.index.json` above `max_file_bytes`), sealed once every rank
is done; any failure (a rank that raises or dies) removes it.
"""

import errno
import json
import logging
import os
import secrets
import signal
import struct
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

import hwfs
from hwfs.dtypes import st_dtype

log = logging.getLogger("hwfs.trainers")

__all__ = ["publish", "PublishError", "TrainerSwap", "POLICIES", "DEFAULT_MAX_FILE_BYTES",
           "WRITE_BUF_BYTES"]

# A checkpoint larger than this is split into HF-style numbered files.
DEFAULT_MAX_FILE_BYTES = 4 << 30
# The most bytes one write copies out of a non-contiguous or device shard at a time.
WRITE_BUF_BYTES = 64 << 20


class PublishError(RuntimeError):
    """publish() failed on some rank; the version was not made (and its
    partial files were removed).  The message says which rank and why."""


def _is_dtensor(t):
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover  (torch < 2.4)
        return False
    return isinstance(t, DTensor)


class _Entry:
    """One tensor of the checkpoint: its global metadata (the same on every
    rank) and, on this rank, the local data it has to write (if any)."""

    __slots__ = ("name", "dtype", "shape", "itemsize", "nbytes", "kind", "writer",
                 "local", "offset", "file", "file_off", "a2a")

    def __init__(self, name, t, granks):
        self.name = name
        self.dtype = st_dtype(t.dtype)
        self.shape = tuple(int(x) for x in t.shape)
        self.itemsize = t.element_size()
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.itemsize
        self.local = None  # (local tensor, global offset) this rank writes
        self.writer = None  # replicated: the rank that writes it
        self.a2a = None  # the dim of a Shard(d >= 1) the ranks exchange into whole rows
        if _is_dtensor(t):
            self.kind = "dtensor"
            self._dtensor_local(name, t)
            self.a2a = self._exchange_dim(t, granks)
        else:
            self.kind = "replicated"
            self.local = (t.detach(), (0,) * len(self.shape))

    def _dtensor_local(self, name, t):
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        mesh, placements = t.device_mesh, t.placements
        coord = mesh.get_coordinate()
        if coord is None:  # this rank holds nothing of it
            return
        for d, p in enumerate(placements):
            if isinstance(p, Replicate):
                if coord[d] != 0:  # another rank of this mesh dim writes the same bytes
                    return
            elif not isinstance(p, Shard):
                raise ValueError(f"tensor {name}: placement {p} cannot be published "
                                 f"(only Shard and Replicate; reduce a Partial first)")
        local = t.to_local()
        lshape, goff = compute_local_shape_and_global_offset(self.shape, mesh, placements)
        if tuple(local.shape) != tuple(lshape):
            raise ValueError(f"tensor {name}: local shard {list(local.shape)} is not the "
                             f"{list(lshape)} its placements {placements} give")
        if local.numel():
            self.local = (local.detach(), tuple(int(x) for x in goff))

    def _exchange_dim(self, t, granks):
        """d when DTensor @t is Shard(d), d >= 1, over a 1-D mesh of exactly
        the group's ranks @granks, and both dim d and the rows before it
        divide by their number: then the ranks trade pieces so that each
        writes whole rows (_write_exchanged) instead of one small write per
        row of its shard.  None otherwise."""
        from torch.distributed.tensor import Shard
        w = len(granks)
        pl = t.placements
        if (w < 2 or t.device_mesh.ndim != 1 or len(pl) != 1 or not isinstance(pl[0], Shard)
                or t.device_mesh.mesh.flatten().tolist() != list(granks)):
            return None
        d = pl[0].dim
        if d < 1 or self.shape[d] % w or int(np.prod(self.shape[:d], dtype=np.int64)) % w:
            return None
        return d

    def meta(self):
        return (self.name, self.dtype, self.shape, self.kind, self.a2a)


def _plan_files(entries, max_file_bytes):
    """Split @entries (already in file order) into files of at most
    @max_file_bytes of tensor data (a larger tensor gets a file of its own):
    a list of lists of entries."""
    files, cur, size = [], [], 0
    for e in entries:
        if cur and size + e.nbytes > max_file_bytes:
            files.append(cur)
            cur, size = [], 0
        cur.append(e)
        size += e.nbytes
    if cur or not files:
        files.append(cur)
    return files


def _header(entries):
    """The safetensors header bytes (8-byte length + JSON padded with spaces to
    a multiple of 8) for @entries, setting each entry's file_off (from the
    start of the file)."""
    hdr = {"__metadata__": {"format": "pt"}}
    off = 0
    for e in entries:
        hdr[e.name] = {"dtype": e.dtype, "shape": list(e.shape),
                       "data_offsets": [off, off + e.nbytes]}
        e.offset = off
        off += e.nbytes
    js = json.dumps(hdr, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    for e in entries:
        e.file_off = 8 + len(js) + e.offset
    return struct.pack("<Q", len(js)) + js, 8 + len(js) + off


def _file_names(n):
    if n == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def _np_bytes(t):
    """A uint8 numpy view of contiguous CPU tensor @t (any dtype, bf16 too)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def _pwrite_all(fd, buf, off):
    mv = memoryview(buf)
    while len(mv):
        n = os.pwrite(fd, mv, off)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        mv = mv[n:]
        off += n


def _write_exchanged(fd, e, rank, world, group, buf_bytes=WRITE_BUF_BYTES):
    """Entry @e (Shard(d), d >= 1, see _Entry._exchange_dim), a collective:
    block by block of at most @buf_bytes of this rank's shard, the ranks trade
    the pieces of the block's rows (all_to_all), so that rank k holds the whole
    rows of the k-th part of the block and writes them with one pwrite.  A
    failed write is returned (not raised: the other ranks still wait for this
    one's pieces), as is everything after it skipped; @fd None skips them all."""
    local, _ = e.local
    d = e.a2a
    outer = int(np.prod(e.shape[:d], dtype=np.int64))
    row = e.nbytes // outer  # bytes of one whole row of the file
    flat = local.contiguous().reshape(outer, -1)  # this rank's columns of every row
    per = max(1, buf_bytes // max(1, flat.shape[1] * e.itemsize))  # rows of a block, per rank
    err = None if fd is not None else OSError(errno.EBADF, "file not open")
    for a in range(0, outer, per * world):
        q = min(per, (outer - a) // world)
        send = [flat[a + j * q:a + (j + 1) * q] for j in range(world)]
        recv = [torch.empty_like(send[0]) for _ in range(world)]
        dist.all_to_all(recv, send, group=group)
        if err is None:
            whole = torch.cat(recv, dim=1).cpu()  # q whole rows: the bounded buffer
            try:
                _pwrite_all(fd, _np_bytes(whole), e.file_off + (a + rank * q) * row)
            except OSError as x:
                err = x
    return err


def _write_local(fd, e, buf_bytes=WRITE_BUF_BYTES):
    """Write this rank's part of entry @e (a box of the global tensor) into the
    file @fd: the box's rows are the runs the file holds contiguously; at most
    @buf_bytes are copied (to the CPU, made contiguous) at a time."""
    local, goff = e.local
    gshape, lshape = e.shape, tuple(local.shape)
    nd = len(gshape)
    if nd == 0:
        _pwrite_all(fd, _np_bytes(local.cpu().contiguous()), e.file_off)
        return
    # j: the last dim the box does not cover fully; every dim after it is whole,
    # so a run is lshape[j] * prod(gshape[j+1:]) elements.
    j = 0
    for d in range(nd - 1, -1, -1):
        if lshape[d] != gshape[d]:
            j = d
            break
    inner = int(np.prod(gshape[j + 1:], dtype=np.int64))
    run = lshape[j] * inner * e.itemsize
    rows = int(np.prod(lshape[:j], dtype=np.int64))
    gstride = [int(np.prod(gshape[d + 1:], dtype=np.int64)) * e.itemsize for d in range(nd)]
    base = e.file_off + goff[j] * gstride[j]
    if not local.is_contiguous():  # (a view of a shard: one copy of it)
        local = local.contiguous()
    flat = local.reshape(rows, -1)
    step = max(1, buf_bytes // max(run, 1))
    for a in range(0, rows, step):
        b = min(rows, a + step)
        blk = flat[a:b].cpu().contiguous()  # on the CPU already: no copy
        data = _np_bytes(blk)
        if j == 0:
            offs = [base]
        else:
            idx = np.unravel_index(np.arange(a, b), lshape[:j])
            offs = base + sum((np.asarray(idx[d]) + goff[d]) * gstride[d] for d in range(j))
        for k, off in enumerate(offs):
            row = data[k * run:(k + 1) * run]
            for p in range(0, run, buf_bytes):  # a single huge run: bounded pieces
                _pwrite_all(fd, row[p:p + buf_bytes], int(off) + p)


class _Sigterm(BaseException):
    pass


class _TermGuard:
    """While publishing, SIGTERM (how torchrun stops the other ranks of a
    failed job) raises, so that the version is cleaned up (main thread only)."""

    def __enter__(self):
        self.old = None
        if threading.current_thread() is threading.main_thread():
            def on_term(signum, frame):
                raise _Sigterm()
            self.old = signal.signal(signal.SIGTERM, on_term)
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)


def _remove_version(mnt, name):
    """Remove open version @name (best effort; it may be gone already)."""
    try:
        mnt.call({"op": "rm", "version": name})
    except Exception:  # noqa: BLE001  (cleanup: the caller reports the real error)
        pass


# The group of a process that runs no torch.distributed: itself alone.
_SOLO = object()


def _agree(err, group):
    """Every rank's error (None when fine) after a step: the first (rank,
    message) that is not None, the same on every rank.  A dead peer makes the
    collective raise: that is reported as an error too."""
    if group is _SOLO:
        return None if err is None else (0, err)
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, err, group=group)
    for r, e in enumerate(out):
        if e is not None:
            return r, e
    return None


def _step(version, group, fn):
    """Run @fn on this rank, then agree with every rank: PublishError naming
    the first rank whose @fn raised, on every rank."""
    err = None
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (reported to every rank)
        err = f"{type(e).__name__}: {e}"
    bad = _agree(err, group)
    if bad:
        raise PublishError(f"publish {version}: rank {bad[0]}: {bad[1]}")


def _close_all(fds):
    """Close every descriptor of dict @fds and empty it (the first error is
    raised once all are closed)."""
    err = None
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError as e:
            err = err or e
    fds.clear()
    if err:
        raise err


def publish(state_dict, version, mount=None, *, group=None, files=None,
            max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """Publish @state_dict as sealed version @version of the hwfs mount @mount
    (a hwfs.Mount, a path, or None: $HWFS_MOUNT, else /hotweights).

    A collective: every rank of @group (None: the default process group) calls
    it with a state dict of the same names, dtypes and global shapes.  Values
    are torch tensors, taken as replicated (the same on every rank: written
    once, by one rank), or DTensors (Shard and Replicate placements: each
    shard written by its owner straight into the full tensor's bytes in the
    file).  @files (rank 0's) adds other files: {relative path: bytes, str or
    os.PathLike to copy}, e.g. config.json and the tokenizer.

    Files: `model.safetensors`, or above @max_file_bytes of tensor data,
    `model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`.
    The version is written under a temporary name and sealed by renaming it to
    @version once every rank's writes are in; on any failure (a rank raising,
    or dying: its peers see the collective fail) it is removed and
    PublishError (or the collective's error) is raised on every live rank.
    Returns the list of the version's file names.

    A process that runs no torch.distributed (none initialized, @group None)
    publishes alone: rank 0 of a world of one, no collective."""
    p = _Publish(version, mount, group)
    ok = False
    try:
        with _TermGuard():
            p.agree_entries(state_dict)  # 1. metadata, the same on every rank (checked)
            p.lay_out(max_file_bytes)
            t_open = time.monotonic()
            p.open_version(files or {})  # 2. rank 0 makes the version and its files
            t_write = time.monotonic()
            _step(version, p.group, p.write_mine)  # 3. every rank writes its part
            t_seal = time.monotonic()
            _step(version, p.group, p.seal)  # 4. rank 0 writes the headers and seals
            log.debug("publish %s, rank %d: opened %.3f s, written %.3f s, sealed %.3f s",
                      version, p.rank, t_write - t_open, t_seal - t_write,
                      time.monotonic() - t_seal)
            ok = True
            return p.names + (["model.safetensors.index.json"] if len(p.names) > 1 else []) + \
                sorted(files or {})
    except _Sigterm:
        raise PublishError(f"publish {version}: rank {p.rank}: stopped by SIGTERM") from None
    except PublishError:
        raise
    except Exception as e:  # a collective failed: a peer died or its connection broke
        raise PublishError(f"publish {version}: rank {p.rank}: {type(e).__name__}: {e}") from e
    finally:
        p.cleanup(ok)


class _Publish:
    """This rank's part of one publish(), step by step: the group, the mount,
    the checkpoint's layout, and what was made so far (the version's temporary
    name, the files open on this rank), so that cleanup() can undo it."""

    def __init__(self, version, mount, group):
        if group is None:
            solo = not (dist.is_available() and dist.is_initialized())
            group = _SOLO if solo else dist.group.WORLD
        self.version, self.group = version, group
        self.rank, self.world = (0, 1) if group is _SOLO else (dist.get_rank(group),
                                                               dist.get_world_size(group))
        self.mnt, self.opened = (mount, False) if isinstance(mount, hwfs.Mount) else \
            (hwfs.open(mount), True)
        self.vdir = os.path.join(self.mnt.mountpoint, "versions")
        self.tmp = None  # the version's temporary name under versions/, once made
        self.fds = {}  # file name -> descriptor open on this rank
        self.entries, self.plan, self.names, self.headers = [], [], [], []

    def agree_entries(self, state_dict):
        """Step 1: an _Entry per tensor, checked to be the same on every rank
        (PublishError naming the first rank that failed or differs)."""
        group, world = self.group, self.world
        err = None
        entries = []
        try:
            granks = [0] if group is _SOLO else \
                [dist.get_global_rank(group, r) for r in range(world)]
            entries = [_Entry(str(k), v, granks) for k, v in state_dict.items()]
        except (TypeError, ValueError) as e:
            err = str(e)
        metas = [(err, [e.meta() for e in entries])]
        if group is not _SOLO:
            metas = [None] * world
            dist.all_gather_object(metas, (err, [e.meta() for e in entries]), group=group)
        for r, (e, _) in enumerate(metas):
            if e is not None:
                raise PublishError(f"publish {self.version}: rank {r}: {e}")
        for r, (_, m) in enumerate(metas):
            if m != metas[0][1]:
                diff = next((a for a, b in zip(m, metas[0][1]) if a != b), None)
                raise PublishError(f"publish {self.version}: rank {r} has a different state "
                                   f"dict than rank 0 (first difference: {diff}, "
                                   f"{len(m)} against {len(metas[0][1])} tensors)")
        self.entries = entries

    def lay_out(self, max_file_bytes):
        """Step 1, continued, the same on every rank: the file order, who
        writes each replicated tensor, the files and their headers."""
        # file order: larger elements first (keeps every tensor aligned), then as given
        order = sorted(range(len(self.entries)), key=lambda i: -self.entries[i].itemsize)
        entries = self.entries = [self.entries[i] for i in order]
        load = [0] * self.world  # replicated tensors: shared out by size
        for e in sorted((e for e in entries if e.kind == "replicated"), key=lambda e: -e.nbytes):
            e.writer = min(range(self.world), key=lambda r: (load[r], r))
            load[e.writer] += e.nbytes
        self.plan = _plan_files(entries, max_file_bytes)
        self.names = _file_names(len(self.plan))
        self.headers = []
        for fi, fentries in enumerate(self.plan):
            hdr, size = _header(fentries)
            self.headers.append((hdr, size))
            for e in fentries:
                e.file = self.names[fi]

    def open_version(self, files):
        """Step 2: rank 0 makes the version under a temporary name and sizes
        its files (zero-filled, so that every rank's writes land in place:
        docs/trainers.md), then tells every rank the name (or its error)."""
        err = None
        if self.rank == 0:
            try:
                if os.path.lexists(os.path.join(self.vdir, self.version)):
                    raise FileExistsError(errno.EEXIST, f"version {self.version} exists")
                self.tmp = f".{self.version}.publish-{secrets.token_hex(4)}"
                os.mkdir(os.path.join(self.vdir, self.tmp))
                for fi, name in enumerate(self.names):
                    fd = os.open(os.path.join(self.vdir, self.tmp, name),
                                 os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    self.fds[name] = fd
                    os.ftruncate(fd, self.headers[fi][1])
                _write_extra(os.path.join(self.vdir, self.tmp), files, self.names, self.plan)
            except Exception as e:  # noqa: BLE001  (reported to every rank)
                err = f"{type(e).__name__}: {e}"
        if self.group is not _SOLO:
            box = [self.tmp, err]
            dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0),
                                       group=self.group)
            self.tmp, err = box
        if err is not None:
            raise PublishError(f"publish {self.version}: rank 0: {err}")

    def _fd(self, name):
        """The descriptor of file @name of the version, opened on first use."""
        if name not in self.fds:
            self.fds[name] = os.open(os.path.join(self.vdir, self.tmp, name), os.O_WRONLY)
        return self.fds[name]

    def write_mine(self):
        """Step 3 (run by _step): this rank's shards and its share of the
        replicated tensors; first the exchanged ones, on every rank in the
        same order (collectives)."""
        err = None
        for e in self.entries:
            if e.a2a is None:
                continue
            if e.file not in self.fds and err is None:
                try:
                    self._fd(e.file)
                except OSError as x:
                    err = x
            err = _write_exchanged(None if err else self.fds[e.file], e, self.rank, self.world,
                                   self.group) or err
        if err is not None:
            raise err
        mine = [e for e in self.entries if e.local is not None and e.a2a is None and
                (e.kind == "dtensor" or e.writer == self.rank)]
        for e in mine:
            _write_local(self._fd(e.file), e)
        if self.rank != 0:
            _close_all(self.fds)

    def seal(self):
        """Step 4 (run by _step): rank 0 writes the headers last (the daemon
        cuts and hashes each file then) and seals by renaming the version."""
        if self.rank != 0:
            return
        for fi, name in enumerate(self.names):
            _pwrite_all(self.fds[name], self.headers[fi][0], 0)
        _close_all(self.fds)
        os.rename(os.path.join(self.vdir, self.tmp), os.path.join(self.vdir, self.version))
        self.tmp = None

    def cleanup(self, ok):
        """Close what is open; remove the version unless @ok; close the mount
        when publish() opened it."""
        try:
            _close_all(self.fds)
        except OSError:
            pass
        if not ok and self.tmp is not None:
            _remove_version(self.mnt, self.tmp)
        if self.opened:
            self.mnt.close()


def _write_extra(root, files, names, plan):
    """Rank 0: the index of a multi-file checkpoint and the caller's @files."""
    if len(names) > 1:
        idx = {"metadata": {"total_size": sum(e.nbytes for f in plan for e in f)},
               "weight_map": {e.name: e.file for f in plan for e in f}}
        with open(os.path.join(root, "model.safetensors.index.json"), "w") as f:
            json.dump(idx, f, indent=2, sort_keys=True)
            f.write("\n")
    for rel, content in files.items():
        rel = os.path.normpath(str(rel))
        if rel.startswith("..") or os.path.isabs(rel):
            raise ValueError(f"file {rel}: must be a relative path inside the version")
        if rel in names or rel == "model.safetensors.index.json":
            raise ValueError(f"file {rel}: publish writes that file itself")
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if isinstance(content, str):
            content = content.encode()
        if isinstance(content, (bytes, bytearray, memoryview)):
            with open(path, "wb") as f:
                f.write(content)
        else:
            with open(content, "rb") as s, open(path, "wb") as f:
                while True:
                    b = s.read(8 << 20)
                    if not b:
                        break
                    f.write(b)



# ------------------------------------------------------------- TrainerSwap

POLICIES = ("keep", "reset", "attenuate")


class TrainerSwap:
    """Swap new versions into a training job at step boundaries, on every rank
    at the same step (docs/trainers.md).

        swap = TrainerSwap(model, optimizer, "/hotweights", policy="reset")
        for step in range(...):
            swap.maybe_swap(step)        # every rank, at the same point of the step
            loss = ...; loss.backward(); optimizer.step()

    @module may be a plain module, a DistributedDataParallel wrapper (every
    rank copies the full parameters) or a module whose parameters are DTensors
    (FSDP2 `fully_shard`, tensor parallelism: every rank copies only its local
    shard, cut from the version's zero-copy mapping; nothing is all-gathered).
    Parameters are copied in place under no_grad: the parameter objects, and so
    the optimizer's references to them, are kept.

    @policy says what happens to the optimizer state of the parameters whose
    tensors changed (their hash differs from the version swapped in before;
    every tensor counts as changed at the first swap unless @start_version
    names the version the weights came from): "keep" leaves it, "reset" zeroes
    every floating-point state tensor (moments; `step` is kept), "attenuate"
    multiplies them by @factor.

    A version that does not fit (missing parameter, shape, dtype) is refused on
    every rank, naming the tensor: the module is not touched, maybe_swap()
    returns None and `refused` holds (version, reason); the version is not
    tried again.  @group: the process group (None: the default one; a job
    without torch.distributed works as a single rank).

    With @engine=NAME, rank 0 also registers the job as engine NAME on its
    node (docs/engines.md): a background thread checks each version that
    arrives or is prepared against the module (names, shapes, dtypes) and
    reports it loaded or refused, so `hwfs commit` waits for the trainer and
    fails, naming the tensor, on a version it could not take; every swap is
    reported `swapped` with its duration as the pause.  The swap itself still
    happens at the next maybe_swap().  close() unregisters."""

    def __init__(self, module, optimizer=None, mount=None, *, policy="keep", factor=0.1,
                 group=None, start_version=None, engine=None):
        if policy not in POLICIES:
            raise ValueError(f"policy {policy!r}: one of {', '.join(POLICIES)}")
        self.module = getattr(module, "module", module) \
            if type(module).__name__ == "DistributedDataParallel" else module
        self.optimizer = optimizer
        self.policy, self.factor = policy, float(factor)
        self.group = group
        self._own_mount = not isinstance(mount, hwfs.Mount)
        self.mount = hwfs.open(mount) if self._own_mount else mount
        self.version = start_version  # the version the weights are from (None: unknown)
        self._hashes = None
        if start_version is not None:
            with self.mount.map(start_version) as m:
                self._hashes = {ti.name: ti.hash for ti in m.tensors()}
        self.refused = None  # (version, reason) of the last refusal
        self.swaps = 0
        self.changed = 0
        self._dist = dist.is_available() and dist.is_initialized()
        self._watch = self._thread = None
        self._stop = threading.Event()
        if engine and self._rank() == 0:
            self._watch = self.mount.watch(engine)
            self._thread = threading.Thread(target=self._engine_loop, daemon=True,
                                            name=f"hwfs-trainer-{engine}")
            self._thread.start()

    # -- the engine side (rank 0, engine=NAME)
    def _fits(self, version):
        """None when @version fits the module, else the reason."""
        from hwfs.torch import Refused, _plan, _targets
        try:
            with self.mount.map(version) as m:
                _plan(_targets(self.module), m, check_dtype=True)
        except Refused as e:
            return str(e)
        except OSError as e:
            return f"cannot load {version}: {e.strerror or e}"
        return None

    def _engine_loop(self):
        while not self._stop.is_set():
            try:
                ev = self._watch.next(timeout=0.2)
            except (ValueError, OSError, hwfs.StreamClosed) as e:
                if not self._stop.is_set():
                    log.error("TrainerSwap engine: %s", e)
                return
            if ev is None or ev.type not in ("arrived", "prepare") or ev.version == self.version:
                continue
            try:
                why = self._fits(ev.version)
                if why is None:
                    self._watch.report("loaded", ev.version)
                else:
                    self._watch.report("refused", ev.version, reason=why)
            except (ValueError, OSError) as e:  # closed under us
                if not self._stop.is_set():
                    log.error("TrainerSwap engine: %s", e)
                return

    def close(self):
        """Unregister the engine (if any) and close the mount handle (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if self._own_mount and self.mount is not None:
            self.mount.close()
            self.mount = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- collectives (a no-op without torch.distributed)
    def _rank(self):
        return dist.get_rank(self.group) if self._dist else 0

    def _bcast(self, obj):
        if not self._dist:
            return obj
        box = [obj]
        g = self.group if self.group is not None else dist.group.WORLD
        dist.broadcast_object_list(box, src=dist.get_global_rank(g, 0), group=self.group)
        return box[0]

    def _gather(self, obj):
        if not self._dist:
            return [obj]
        out = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def _decide(self):
        """Rank 0: the version to swap to now, or None."""
        cur = self.mount.current()
        if cur is None or cur == self.version:
            return None
        if self.refused is not None and self.refused[0] == cur:
            return None
        return cur

    def maybe_swap(self, step=None):
        """Call at a step boundary, on every rank (a collective).  Rank 0 looks
        whether `current` moved since the last swap and tells every rank; all
        swap, or none.  Returns the version swapped in, or None."""
        version = self._bcast(self._decide() if self._rank() == 0 else None)
        if version is None:
            return None
        from hwfs.torch import Refused, _plan, _targets, _view
        err, plan, m = None, None, None
        t0 = time.monotonic()
        try:
            m = self.mount.map(version)
            plan = _plan(_targets(self.module), m, check_dtype=True)
        except (Refused, OSError, ValueError, TypeError) as e:
            err = str(e)
        errs = self._gather(err)
        bad = next((e for e in errs if e is not None), None)
        if bad is not None:
            if m is not None:
                m.close()
            self.refused = (version, bad)
            log.warning("TrainerSwap: version %s refused at step %s: %s", version, step, bad)
            return None
        try:
            hashes = {ti.name: ti.hash for ti in m.tensors()}
            changed = []
            with torch.no_grad():
                for target, name in plan:
                    src = _view(m, name)
                    if _is_dtensor(target):
                        _copy_local_shard(target, src)
                    else:
                        target.copy_(src)
                    if self._hashes is None or self._hashes.get(name) != hashes[name]:
                        changed.append(target)
                self._apply_policy(changed)
        finally:
            m.close()
        self._hashes = hashes
        self.version = version
        self.swaps += 1
        self.changed = len(changed)
        if self._watch is not None:
            try:
                self._watch.report("swapped", version,
                                   pause_us=max(1, int((time.monotonic() - t0) * 1e6)))
            except (ValueError, OSError) as e:
                log.error("TrainerSwap engine: cannot report the swap: %s", e)
        return version

    def _apply_policy(self, changed):
        if self.optimizer is None or self.policy == "keep":
            return
        for p in changed:
            st = self.optimizer.state.get(p)
            for k, v in (st or {}).items():
                if k == "step" or not torch.is_tensor(v) or not v.is_floating_point():
                    continue
                local = v.to_local() if _is_dtensor(v) else v
                if self.policy == "reset":
                    local.zero_()
                else:
                    local.mul_(self.factor)


def _copy_local_shard(target, full):
    """Copy this rank's box of the full tensor @full (a zero-copy view of the
    version) into DTensor @target's local shard, in place."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    local = target.to_local()
    if local.numel() == 0:
        return
    lshape, goff = compute_local_shape_and_global_offset(target.shape, target.device_mesh,
                                                         target.placements)
    idx = tuple(slice(o, o + n) for o, n in zip(goff, lshape))
    local.copy_(full[idx])
