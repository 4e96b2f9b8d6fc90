"""hwfs.torch — hwfs versions as PyTorch tensors, and a hot-swapping engine.

    from hwfs.torch import HotSwap, swap_in_place, tensors

    hs = HotSwap(model, "/hotweights", engine="llama-a")   # serves `current` at once
    while True:
        with hs.serving():              # a shared lock; the swap takes it exclusively
            out = model(x)

HotSwap registers the process as engine NAME on the node (docs/engines.md):
when a version arrives, or a commit of it is prepared, a background thread
shadow-loads it beside the serving one (device "cpu": zero-copy tensors over
the daemon's arena; another device: copies into fresh device tensors), checks
every parameter and persistent buffer of the module against it by name, shape
and dtype, and reports it loaded (or refused, naming the tensor).  The commit
barrier of the node waits for that report.  When `current` flips to it, the
thread swaps the module's tensors (`param.data = shadow`) under the lock, all
or nothing, reports the pause, and releases the old version.  Up to
`shadows` (default 2) versions stay loaded beside the served one, the most
recently arrived or prepared: a version whose commit passed the barrier is
still loaded when a newer one arrives before the flip.

On device "cpu" (zero_copy=True, the default) the module's weights ARE the
arena's read-only pages after a load: inference only.  Writing them in place
(an optimizer step, `param.add_()`) would fault (SIGSEGV); pass
zero_copy=False to load copies instead.
"""

import errno
import logging
import threading
import time
import warnings

import torch

import hwfs
from hwfs.dtypes import torch_dtype

__all__ = ["HotSwap", "swap_in_place", "tensors", "torch_dtype", "Refused"]

log = logging.getLogger("hwfs.torch")

# How long the engine thread waits for an event before it looks again at
# whether close() was asked for.
EVENT_POLL_S = 0.2


class Refused(ValueError):
    """A version cannot be served by the module (the message says which tensor and why)."""


def _view(mapping, key):
    """Tensor @key of @mapping as a CPU torch tensor over the mapping (no copy).

    The tensor keeps the mapping alive (its storage refers to the buffer,
    whose base refers to the mapping's owner)."""
    ti = mapping.info(key)
    dt = torch_dtype(ti.dtype)
    if ti.nbytes == 0:
        return torch.empty(ti.shape, dtype=dt)
    with warnings.catch_warnings():
        # The buffer is read-only on purpose: torch warns that it has no
        # read-only tensors.  The docs of this module say what that means.
        warnings.filterwarnings("ignore", message=".*not writable.*")
        t = torch.frombuffer(mapping.buffer(key), dtype=dt)
    return t.view(ti.shape)


def tensors(mapping):
    """Every tensor of @mapping (a hwfs.Mapping) as a zero-copy CPU torch tensor, by name."""
    return {name: _view(mapping, name) for name in mapping}


def _targets(module):
    """What a version must provide for @module: a list of (names, tensor, is_param).

    One entry per distinct tensor object: tied weights (one Parameter under
    several names) appear once with all their names, any of which the file
    may use.  Persistent buffers are included (is_param False: optional)."""
    persistent = set(module.state_dict(keep_vars=True).keys())
    buffers = [(n, b) for n, b in module.named_buffers(remove_duplicate=False)
               if n in persistent and b is not None]
    by_id = {}  # id -> (tensor, [names], is_param), in first-seen order
    for is_param, named in ((True, module.named_parameters(remove_duplicate=False)),
                            (False, buffers)):
        for name, t in named:
            by_id.setdefault(id(t), (t, [], is_param))[1].append(name)
    return [(tuple(names), t, is_param) for t, names, is_param in by_id.values()]


def _shape(s):
    return list(int(x) for x in s)


def _plan(module_targets, mapping, check_dtype):
    """Match @module_targets against @mapping: a list of (target, name in the
    file).  Raises Refused naming the first tensor that is missing or differs."""
    plan = []
    for names, target, is_param in module_targets:
        found = next((n for n in names if n in mapping), None)
        if found is None:
            if is_param:
                raise Refused(f"tensor {names[0]}: missing from {mapping.version}, "
                              f"model has {_shape(target.shape)}")
            continue
        ti = mapping.info(found)
        if tuple(ti.shape) != tuple(target.shape):
            raise Refused(f"tensor {found}: shape {_shape(ti.shape)}, "
                          f"model has {_shape(target.shape)}")
        try:
            dt = torch_dtype(ti.dtype)
        except TypeError as e:
            raise Refused(f"tensor {found}: {e}") from None
        if check_dtype and dt != target.dtype:
            raise Refused(f"tensor {found}: dtype {ti.dtype}, model has {target.dtype}")
        if ti.nbytes != target.numel() * torch.empty(0, dtype=dt).element_size():
            raise Refused(f"tensor {found}: {ti.nbytes} bytes do not hold {ti.dtype} "
                          f"{_shape(ti.shape)}")
        plan.append((target, found))
    return plan


def _open_mount(mount):
    """(Mount, whether we opened it) for a hwfs.Mount, a path or None."""
    if isinstance(mount, hwfs.Mount):
        return mount, False
    return hwfs.open(mount), True


def swap_in_place(module, version, mount=None):
    """Copy version @version into @module's tensors in place (param.data.copy_).

    Every parameter (and persistent buffer present in the file) is checked
    first: a missing parameter or a shape that differs raises ValueError
    naming the tensor, and then nothing was changed.  dtypes are converted by
    the copy.  The version is unmapped before returning.  The caller makes
    sure nothing serves from @module while it runs.  Returns the number of
    tensors copied."""
    mnt, opened = _open_mount(mount)
    try:
        with mnt.map(version) as m:
            plan = _plan(_targets(module), m, check_dtype=False)
            with torch.no_grad():
                for target, name in plan:
                    target.data.copy_(_view(m, name))
            return len(plan)
    finally:
        if opened:
            mnt.close()


class _RWLock:
    """Many serving threads share it; the swap holds it alone.  A waiting swap
    blocks new serving entries (it is never starved).  Not reentrant."""

    def __init__(self):
        self._c = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def acquire_shared(self):
        with self._c:
            while self._writer or self._writers_waiting:
                self._c.wait()
            self._readers += 1

    def release_shared(self):
        with self._c:
            self._readers -= 1
            if self._readers == 0:
                self._c.notify_all()

    def acquire_exclusive(self):
        with self._c:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._c.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True

    def release_exclusive(self):
        with self._c:
            self._writer = False
            self._c.notify_all()

    @property
    def writers_waiting(self):
        with self._c:
            return self._writers_waiting


class _Shared:
    """`with hs.lock:` — the serving side of the swap lock."""

    def __init__(self, rw):
        self._rw = rw

    def __enter__(self):
        self._rw.acquire_shared()
        return self

    def __exit__(self, *exc):
        self._rw.release_shared()


class _Loaded:
    """A version loaded beside the serving one: (target, new tensor) pairs,
    and the mapping they read (None once copies no longer need it)."""

    def __init__(self, version, pairs, mapping):
        self.version, self.pairs, self.mapping = version, pairs, mapping

    def release(self):
        self.pairs = []
        if self.mapping is not None:
            self.mapping.close()
            self.mapping = None


class HotSwap:
    """Serve @module from the hwfs mount @mount as engine @engine.

    At start it loads the version `current` names into @module (raising
    Refused when it does not fit) and reports it served.  Then a background
    thread shadow-loads arriving versions and swaps at each commit; requests
    must run inside `with hs.serving():` (or `with hs.lock:`) so that a swap
    never lands in the middle of one.

    Attributes: version (the version served), shadows (the versions loaded
    beside it, oldest first; at most @shadows of them), shadow (the newest of
    them, or None), swap_pending (a swap waits for the requests in flight),
    last_pause_us (how long the last swap held the lock, in microseconds),
    swaps, refused ({version: reason}), error (the last error of the
    background thread, or None).
    """

    def __init__(self, module, mount=None, engine=None, device="cpu", zero_copy=True, shadows=2):
        if not engine:
            raise ValueError("HotSwap needs an engine name (engine=NAME)")
        if int(shadows) < 1:
            raise ValueError("HotSwap keeps at least one shadow (shadows >= 1)")
        self.max_shadows = int(shadows)
        self.module = module
        self.engine = engine
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.zero_copy = zero_copy and self.device.type == "cpu"
        self._mount, self._own_mount = _open_mount(mount)
        self._targets = _targets(module)
        for names, t, _ in self._targets:
            if t.device != self.device:
                raise ValueError(f"tensor {names[0]} is on {t.device}, not on {self.device}: "
                                 f"move the module to the device first")
        self._rw = _RWLock()
        self.lock = _Shared(self._rw)
        self._cond = threading.Condition()  # notified at every swap and refusal
        self.version = None
        self.shadow = None
        self.shadows = []
        self.last_pause_us = None
        self.swaps = 0
        self.refused = {}
        self.error = None
        self._serving = None  # the _Loaded being served
        self._shadows = []    # _Loaded beside it, least recently arrived/prepared first
        self._stop = threading.Event()
        self._thread = None
        self._watch = self._mount.watch(engine)
        try:
            cur = self._watch.current
            if cur is not None:
                self._swap(self._load(cur), initial=True)
        except BaseException:
            self._watch.close()
            if self._own_mount:
                self._mount.close()
            raise
        self._thread = threading.Thread(target=self._run, name=f"hwfs-engine-{engine}",
                                        daemon=True)
        self._thread.start()

    # -- the serving side
    def serving(self):
        """The context manager a request runs in: `with hs.serving(): out = model(x)`."""
        return self.lock

    @property
    def swap_pending(self):
        """True while a swap waits for the requests in flight to finish."""
        return self._rw.writers_waiting > 0

    def wait_version(self, version, timeout=None):
        """Wait until @version is served; True if it is, False at @timeout seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self.version == version, timeout)

    # -- loading and swapping
    def _load(self, version):
        """Load @version beside the serving one: a _Loaded, or Refused."""
        m = self._mount.map(version)
        try:
            plan = _plan(self._targets, m, check_dtype=True)
            pairs = []
            for target, name in plan:
                src = _view(m, name)
                if not self.zero_copy:
                    dst = torch.empty_like(target, device=self.device)
                    dst.copy_(src, non_blocking=self.device.type == "cuda")
                    src = dst
                pairs.append((target, src))
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except BaseException:
            m.close()
            raise
        if not self.zero_copy:
            m.close()  # the copies do not read it: end the lease now
            m = None
        return _Loaded(version, pairs, m)

    def _swap(self, loaded, initial=False):
        """Serve @loaded: swap every tensor under the exclusive lock, all or
        nothing (an exception part-way puts back every tensor already
        swapped, then propagates: the module serves what it served, and
        nothing is reported); report the pause (0 for the load at start),
        release what was served before (and @loaded is no shadow any more)."""
        pairs = list(loaded.pairs)  # prepared before the lock: the pause is the assignments
        done = []
        self._rw.acquire_exclusive()
        t0 = time.perf_counter_ns()
        try:
            for target, new in pairs:
                old = target.data
                target.data = new
                done.append((target, old))
            self.version = loaded.version  # a request sees the version it ran on
        except BaseException:
            for target, old in reversed(done):
                target.data = old
            raise
        finally:
            t1 = time.perf_counter_ns()
            self._rw.release_exclusive()
        pause_us = 0 if initial else max(1, (t1 - t0) // 1000)
        old, self._serving = self._serving, loaded
        loaded.pairs = []  # the module holds the tensors now
        self._set_shadows(self._without(loaded))  # served, no shadow
        if old is not None:
            old.release()  # the old tensors die with the last reference to them
        with self._cond:
            if not initial:
                self.last_pause_us = pause_us
                self.swaps += 1
            self._cond.notify_all()
        self._watch.report("swapped", loaded.version, pause_us=pause_us)
        log.info("engine %s: serving %s (pause %d us)", self.engine, loaded.version, pause_us)

    # -- the shadows (engine thread only, and close() once it ended)
    def _find_shadow(self, version):
        return next((x for x in self._shadows if x.version == version), None)

    def _without(self, loaded):
        """The shadows but @loaded, oldest first."""
        return [x for x in self._shadows if x is not loaded]

    def _set_shadows(self, shadows):
        """Make @shadows (oldest first) the shadows, and say so in the attributes."""
        self._shadows = shadows
        self.shadows = [x.version for x in shadows]
        self.shadow = self.shadows[-1] if shadows else None

    def _drop_shadows(self, keep):
        """Release the oldest shadows until at most @keep are left."""
        while len(self._shadows) > keep:
            oldest = self._shadows[0]
            self._set_shadows(self._shadows[1:])
            oldest.release()

    def _shadow_load(self, version):
        """Shadow-load @version (already loaded: it becomes the newest shadow)
        and report loaded or refused; the _Loaded or None.  The oldest
        shadows are released first, so that at most max_shadows are loaded."""
        loaded = self._find_shadow(version)
        if loaded is not None:
            self._set_shadows(self._without(loaded) + [loaded])
            self._watch.report("loaded", version)
            return loaded
        if version in self.refused:
            self._watch.report("refused", version, reason=self.refused[version])
            return None
        self._drop_shadows(self.max_shadows - 1)
        self._watch.report("loading", version)
        try:
            loaded = self._load(version)
        except Refused as e:
            reason = str(e)
            with self._cond:
                self.refused[version] = reason
                self._cond.notify_all()
            self._watch.report("refused", version, reason=reason)
            log.warning("engine %s: refused %s: %s", self.engine, version, reason)
            return None
        except Exception as e:  # not cached: the next prepare tries again
            reason = f"cannot load {version}: {e.strerror if isinstance(e, OSError) else e}"
            self._watch.report("refused", version, reason=reason)
            log.warning("engine %s: %s", self.engine, reason)
            return None
        self._set_shadows(self._shadows + [loaded])
        self._watch.report("loaded", version)
        return loaded

    def _on_event(self, ev):
        v = ev.version
        if ev.type in ("arrived", "prepare"):
            if v != self.version:
                self._shadow_load(v)
        elif ev.type == "current":
            if v == self.version:
                return
            loaded = self._find_shadow(v) or self._shadow_load(v)
            if loaded is None:
                self.error = f"current is {v}, which this engine refused: still serving {self.version}"
                log.error("engine %s: %s", self.engine, self.error)
                return
            self._swap(loaded)  # raises when it failed: the shadow stays
        elif ev.type == "removed":
            gone = self._find_shadow(v)
            if gone is not None:
                self._set_shadows(self._without(gone))
                gone.release()  # let `hwfs rm` free its bytes
            self.refused.pop(v, None)

    def _run(self):
        while not self._stop.is_set():
            try:
                ev = self._watch.next(timeout=EVENT_POLL_S)
            except hwfs.StreamClosed:
                self.error = "the daemon closed the engine stream"
                log.error("engine %s: %s; still serving %s", self.engine, self.error, self.version)
                return
            except ValueError:  # closed
                return
            except OSError as e:
                self.error = str(e)
                log.error("engine %s: %s", self.engine, e)
                if e.errno == errno.EPROTO:
                    continue  # a malformed event, dropped by libhwfs: read on
                return
            if ev is None:
                continue
            try:
                self._on_event(ev)
            except ValueError:  # the watch was closed under us
                return
            except Exception as e:  # keep serving; say what went wrong
                self.error = f"{ev.type} {ev.version}: {e}"
                log.exception("engine %s: %s", self.engine, self.error)

    def close(self):
        """Stop the engine thread, wait for it, then unregister (idempotent).
        The module keeps the weights it serves (and, zero-copy, the lease on
        them); the shadows are released."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()  # it looks at _stop at least every EVENT_POLL_S
        self._watch.close()
        self._drop_shadows(0)
        if self._own_mount:
            self._mount.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# Trainers (docs/trainers.md): the sharded publish and the distributed swap.
from hwfs.trainers import PublishError, TrainerSwap, publish  # noqa: E402

__all__ += ["publish", "PublishError", "TrainerSwap"]
