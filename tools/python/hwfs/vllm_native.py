"""hwfs.vllm_native — hwfs inside vLLM through vLLM's own extension points.

    python -m vllm.entrypoints.openai.api_server --model /hotweights/versions/v1 \\
        --load-format hwfs --weight-transfer-config '{"backend": "hwfs"}' ...

Registered by hwfs.vllm_plugin (the package's vllm.general_plugins entry
point); docs/engines.md, "vLLM's native weight-transfer API", is the manual.

* HwfsModelLoader (`--load-format hwfs`): --model is a version directory of
  an hwfs mount (MOUNT/versions/V, or MOUNT/current, resolved once).  Its
  config and tokenizer files are read from there as usual; the tensors come
  from a zero-copy map of V through libhwfs (hwfs.map: the daemon's arena,
  no byte through FUSE), fed to the model's own load_weights.  The version
  and its digest are recorded: GET /weight_info names it (hwfs.vllm_plugin),
  and the backend below serves it from the start.

* HwfsWeightTransferEngine (backend "hwfs", one per worker: every TP/PP rank):
  - at start, on a server loaded from a mount, it takes over the loaded
    parameters (hwfs.vllm.WorkerExtension's attach, in place) and registers
    the server as an engine of the node (NAME: $HWFS_ENGINE, else the host
    name; ".rankN" appended when the server has several workers), reported
    serving the loaded version;
  - init_info {"mount", "engine"} registers it there under that name instead;
    {"mode": "in_place"} has the node's events check a version only (no
    shadow: the swap loads it into the live weights), {"swap": "copy"}
    copies a shadow into the live storage at the swap (CUDA graphs), and
    {"slice_mib": N} sets the slice (default $HWFS_VLLM_SLICE_MIB, else 64);
  - update_info {"version": V} maps V, checks it against the served version
    (a misfit is refused, naming the tensor: nothing changes) and starts
    its shadow-load beside the served weights; the load runs on a thread
    of the worker, a slice at a time, never while a forward pass runs (a
    gate that forward hooks take: see _Gate), so serving goes on;
    finish_weight_update waits for the load and swaps every parameter's
    storage between two steps (one collective_rpc: all workers together);
  - update_info {"version": V, "mode": "in_place"} loads V into the live
    parameters inside the call (no shadow memory; the engine loop waits
    for the whole load: that is the pause);
  - commit-driven: the node's events reach the same code: a version that
    arrives, or that a commit prepares, is shadow-loaded and reported
    loaded (or refused with the reason: `hwfs commit` fails with it); at the
    flip of `current` the worker swaps at once, between two forward passes
    (a request in flight ends on the new weights), or, with init_info
    {"flip": "driver"}, leaves the swap to a driver that holds the requests
    first and calls the routes: hwfs-vllm is that driver (_vllm_cli.py).
  Versions are known by their digest, not by name: a name removed and
  published again with other bytes is loaded again.
"""

import json
import os
import re
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (TrainerInitInfo, TrainerWeightTransferEngine,
                                                   WeightTransferEngine, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo)
from vllm.logger import init_logger
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

import hwfs
from hwfs.torch import _view
from hwfs.vllm import WorkerExtension, _one_line

logger = init_logger("vllm.hwfs")

DEFAULT_MOUNT = "/hotweights"
SLICE_BYTES = max(1, int(float(os.environ.get("HWFS_VLLM_SLICE_MIB") or 64) * (1 << 20)))
# test knob: seconds the loader waits between two slices (a load long enough to be seen)
SLICE_PAUSE = float(os.environ.get("HWFS_VLLM_SLICE_PAUSE", "0") or 0)
EVENT_POLL_S = 0.5

# What this process serves through hwfs (one model per worker process):
# {"version", "digest", "mount", "gen", "load_s"}; gen counts loads and swaps.
_SERVED = {}
_LOCK = threading.Lock()


def _set_served(**kw):
    with _LOCK:
        _SERVED.update(kw, gen=_SERVED.get("gen", 0) + 1)


def served_info(worker=None):
    """What this worker serves through hwfs: {"version", "digest", "gen",
    "load_s", ...} or None.  Called in the worker by the engine core's
    collective_rpc (hwfs.vllm_plugin), @worker being vLLM's worker."""
    with _LOCK:
        return dict(_SERVED) if _SERVED else None


def version_dir(path):
    """(mount root, version) of @path, a version directory of an hwfs mount
    (MOUNT/versions/V, or a link to one such as MOUNT/current).  ValueError
    otherwise (OSError ENOTSUP from hwfs.open when MOUNT is no hwfs mount)."""
    real = os.path.realpath(path)
    parent, name = os.path.split(real)
    root, versions = os.path.split(parent)
    if versions != "versions" or not name:
        raise ValueError(f"{path} is not a version directory of an hwfs mount "
                         f"(MOUNT/versions/V or MOUNT/current)")
    return root, name


def default_engine_name():
    name = os.environ.get("HWFS_ENGINE") or socket.gethostname() or "vllm"
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)[:64]


# --------------------------------------------------------------------------
# --load-format hwfs


class HwfsModelLoader(BaseModelLoader):
    """`--load-format hwfs`: the weights of --model's version, mapped zero-copy."""

    def download_model(self, model_config) -> None:
        pass  # nothing to download: the version is on the mount

    def load_weights(self, model, model_config) -> None:
        root, version = version_dir(model_config.model)
        t0 = time.perf_counter()
        with hwfs.open(root) as m:
            mapping = m.map(version)
        try:
            with torch.no_grad():
                loaded = model.load_weights((n, _view(mapping, n)) for n in mapping)
            if isinstance(loaded, set) and model_config.quantization is None:
                left = sorted(n for n, _ in model.named_parameters() if n not in loaded)
                if left:
                    raise ValueError(f"hwfs: {len(left)} parameter(s) not loaded from version "
                                     f"{version} of {root}: {', '.join(left[:5])}")
            digest = mapping.digest
        finally:
            mapping.close()
        load_s = time.perf_counter() - t0
        _set_served(version=version, digest=digest, mount=root, load_s=round(load_s, 3))
        logger.info("hwfs: loaded version %s of %s (digest %s) from a zero-copy map in %.3f s",
                    version, root, digest[:12], load_s)


# --------------------------------------------------------------------------
# the weight-transfer backend "hwfs"


@dataclass
class HwfsInitInfo(WeightTransferInitInfo):
    mount: str | None = None
    engine: str | None = None
    # at a commit's flip: "self" swaps at once, between two forward passes
    # (a request in flight then ends on the new weights); "driver" leaves the
    # swap to finish_weight_update from a driver that holds the requests
    # first (hwfs-vllm: /pause, start, update, finish, /resume: none mixed)
    flip: str = "self"
    # what a version that arrives, or that a commit prepares, gets: "shadow"
    # (a shadow-load beside the served weights) or "in_place" (a check only;
    # the swap loads it into the live weights: no shadow memory)
    mode: str = "shadow"
    # the swap: "pointer" (each parameter's storage swapped to its shadow) or
    # "copy" (the shadow copied into the live storage: CUDA graphs keep it)
    swap: str = "pointer"
    slice_mib: float | None = None  # MiB per slice (None: $HWFS_VLLM_SLICE_MIB, else 64)

    def __post_init__(self):
        for field, allowed in (("flip", ("self", "driver")), ("mode", ("shadow", "in_place")),
                               ("swap", ("pointer", "copy"))):
            if getattr(self, field) not in allowed:
                raise TypeError(f"init_info \"{field}\" is \"{allowed[0]}\" or "
                                f"\"{allowed[1]}\", not {getattr(self, field)!r}")
        if self.slice_mib is not None and (isinstance(self.slice_mib, bool) or not isinstance(
                self.slice_mib, (int, float)) or not self.slice_mib > 0):
            raise TypeError(f"init_info \"slice_mib\" is a number above 0, not "
                            f"{self.slice_mib!r}")


@dataclass
class HwfsUpdateInfo(WeightTransferUpdateInfo):
    version: str = ""
    mode: str = "shadow"

    def __post_init__(self):
        if not isinstance(self.version, str) or not self.version:
            raise TypeError("update_info needs \"version\": the name of a sealed hwfs version")
        if self.mode not in ("shadow", "in_place"):
            raise TypeError(f"update_info \"mode\" is \"shadow\" or \"in_place\", not "
                            f"{self.mode!r}")


class _Gate:
    """Forward passes against the loader.  A shadow-load slice points every
    parameter's .data at the shadow for its length (the model's own
    load_weights writes there); no forward pass may run meanwhile.  Forward
    hooks on the model (and on the modules vLLM calls outside its forward:
    the logits processor, the embeddings) enter the gate; the loader and the
    swap take it alone.  They take turns: a slice waits for the forward pass
    in progress, and when it ends a forward pass that waited goes first, so
    under any load a forward pass waits at most one slice and the load still
    moves a slice per forward pass."""

    def __init__(self):
        self._c = threading.Condition(threading.Lock())
        self._owner = None  # the thread in a forward pass
        self._depth = 0
        self._waiting = 0       # forward passes waiting
        self._alone_waiting = 0  # the loader or a swap, waiting
        self._busy = False
        self._forward_turn = False  # a slice just ended with forward passes waiting

    def install(self, model):
        mods = [model] + [m for m in model.modules() if m is not model and (
            "LogitsProcessor" in type(m).__name__
            or ("Embedding" in type(m).__name__ and m._parameters))]
        for m in mods:
            m.register_forward_pre_hook(lambda *_: self.enter())
            m.register_forward_hook(lambda *_: self.leave(), always_call=True)
        return len(mods)

    def enter(self):
        me = threading.get_ident()
        with self._c:
            if self._owner == me:
                self._depth += 1
                return
            self._waiting += 1
            try:
                while self._busy or self._owner is not None or (
                        self._alone_waiting and not self._forward_turn):
                    self._c.wait()
            finally:
                self._waiting -= 1
            self._owner, self._depth, self._forward_turn = me, 1, False

    def leave(self):
        with self._c:
            if self._owner != threading.get_ident():
                return
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._c.notify_all()

    @contextmanager
    def alone(self):
        """No forward pass runs inside: yields the seconds waited for one."""
        t0 = time.perf_counter()
        with self._c:
            self._alone_waiting += 1
            try:
                while self._busy or self._owner is not None or self._forward_turn:
                    self._c.wait()
            finally:
                self._alone_waiting -= 1
            self._busy = True
        try:
            yield time.perf_counter() - t0
        finally:
            with self._c:
                self._busy = False
                self._forward_turn = self._waiting > 0
                self._c.notify_all()


class _Ext(WorkerExtension):
    """hwfs.vllm.WorkerExtension (the loading core) on a model, without a vLLM worker."""

    def __init__(self, model):
        self._model = model

    def _hwfs_model(self):
        return self._model


class _Refused(ValueError):
    pass


def _ok(r):
    if not r.get("ok"):
        raise _Refused(r.get("error") or "failed")
    return r


class HwfsWeightTransferEngine(WeightTransferEngine[HwfsInitInfo, HwfsUpdateInfo]):
    init_info_cls = HwfsInitInfo
    update_info_cls = HwfsUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        self.rank, self.world = 0, 1
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self.rank, self.world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        self.ext = _Ext(model)
        self.st = self.ext._hwfs()
        self.cv = threading.Condition(threading.RLock())  # guards st and what follows
        self.contenders = 0      # threads waiting for self.cv: the loader lets them in first
        self._cnt = threading.Lock()
        self.gate = _Gate()
        self.gate.install(model)
        self.mount = None        # the mount versions are mapped from
        self.name = None         # the engine name registered (None: not registered)
        self.watch = None
        self.watcher = None      # the thread reading the node's events
        self.session = None      # a native update: {"version": V, "state": ...}
        self.flip = "self"       # who swaps at a commit's flip (HwfsInitInfo.flip)
        self.events_mode = "shadow"  # what the node's events load (HwfsInitInfo.mode)
        self.copy_swap = False   # HwfsInitInfo.swap == "copy"
        self.slice_bytes = SLICE_BYTES
        self.same_bytes = None   # a version named otherwise whose bytes are served
        self.stopping = False
        self.last = {}           # the last swap's timings
        self.loader = threading.Thread(target=self._loader, name="hwfs-loader", daemon=True)
        self.loader.start()
        rec = served_info()
        if rec is None:
            try:  # loaded from the mount by another loader: serve what it names
                rec = dict(zip(("mount", "version"), version_dir(self.model_config.model)))
            except (ValueError, OSError):
                rec = None
        if rec is not None:
            self.mount = rec["mount"]
            try:
                with self._held():
                    r = _ok(self.ext.hwfs_attach({"mount": self.mount, "version": rec["version"],
                                                  "in_place": "digest" in rec}))
                    if "digest" not in rec:
                        _set_served(version=rec["version"], digest=self.st.served_digest,
                                    mount=self.mount)
                logger.info("hwfs: worker %d serves %s (%d layer(s) given their checkpoint-format "
                            "weights back)", self.rank, rec["version"], r.get("converted", 0))
            except Exception as e:  # noqa: BLE001  serve on; updates will say why
                logger.warning("hwfs: cannot take over the weights of %s: %s", rec["version"], e)
                return
            try:
                self._register(self.mount, default_engine_name())
            except Exception as e:  # noqa: BLE001  init_weight_transfer_engine may name another
                logger.warning("hwfs: not registered as an engine of %s: %s (POST "
                               "/init_weight_transfer_engine with {\"engine\": NAME} to register)",
                               self.mount, e)

    @contextmanager
    def _held(self):
        """self.cv, taken before the loader's next slice (it waits for us)."""
        with self._cnt:
            self.contenders += 1
        try:
            self.cv.acquire()
        finally:
            with self._cnt:
                self.contenders -= 1
        try:
            yield
        finally:
            self.cv.notify_all()
            self.cv.release()

    # -- registration with the node's daemon
    def _engine_name(self, name):
        return name if self.world == 1 else f"{name}.rank{self.rank}"

    def _register(self, mount, name):
        name = self._engine_name(name)
        mount = os.path.realpath(mount)
        if self.watch is not None and (self.mount, self.name) == (mount, name):
            return
        self._unregister()
        with hwfs.open(mount) as m:
            w = m.watch(engine=name)
        with self._held():
            self.watch, self.name, self.mount = w, name, mount
            if self.st.attached and self.st.served:
                try:  # the served version as this mount knows it: the same bytes?
                    with hwfs.open(mount) as m, m.map(self.st.served) as mp:
                        same = mp.digest == self.st.served_digest
                except OSError:
                    same = False
                if same:
                    self._report("swapped", self.st.served, pause_us=0)
        self.watcher = threading.Thread(target=self._events, args=(w,), daemon=True,
                                        name=f"hwfs-engine-{name}")
        self.watcher.start()
        logger.info("hwfs: worker %d registered as engine %s of %s, serving %s", self.rank,
                    name, mount, self.st.served)

    def _unregister(self):
        w, t = self.watch, self.watcher
        self.watch, self.watcher, self.name = None, None, None
        if w is not None:
            w.close()
        if t is not None and t is not threading.current_thread():
            t.join(10)

    def _report(self, what, version, reason=None, **kw):
        w = self.watch
        if w is None:
            return
        try:
            w.report(what, version, reason=reason, **kw)
        except (OSError, ValueError) as e:
            logger.warning("hwfs: cannot report %s %s: %s", what, version, e)

    # -- loading (callers hold self.cv)
    def _mnt(self):
        return self.mount or os.environ.get("HWFS_MOUNT") or DEFAULT_MOUNT

    def _map(self, version):
        with hwfs.open(self._mnt()) as m:
            return m.map(version)

    def _want(self, v, check_only=False):
        """Make @v the shadow: "serving" (its bytes are served), "loaded" or
        "loading" (the loader goes on), or "attach" (nothing of hwfs's is
        served yet: the swap loads it whole, _attach); @check_only: no
        shadow, "checked" (the swap loads it in place, _load_in_place).
        Raises _Refused (a misfit: nothing changed), OSError (no such
        version...)."""
        st = self.st
        mapping = self._map(v)
        if not st.attached:
            mapping.close()
            self._report("loaded", v)
            logger.info("hwfs: %s: nothing served from the mount yet; the swap loads it", v)
            return "attach"
        if mapping.digest == st.served_digest:
            mapping.close()
            self.same_bytes = v if v != st.served else None
            self._report("loaded", v)
            return "serving"
        if (st.shadow_version == v and st.shadow_digest == mapping.digest
                and st.shadow_state in (("checked",) if check_only else ("loading", "loaded"))):
            mapping.close()
            return st.shadow_state
        if not check_only:
            self._report("loading", v)
        try:
            r = _ok(self.ext.hwfs_prepare({"version": v, "_mapping": mapping,
                                           "low_memory": check_only}))
        except _Refused as e:
            self._report("refused", v, reason=str(e))
            raise
        if check_only:
            self._report("loaded", v)
            logger.info("hwfs: worker %d checked %s (no shadow: the swap loads it in place)",
                        self.rank, v)
            return "checked"
        if r.get("loaded"):  # the standby held these bytes
            self._report("loaded", v)
            return "loaded"
        self.cv.notify_all()  # the loader
        return "loading"

    def _wait_loaded(self, v):
        """Wait (holding self.cv) until @v's shadow is loaded; _Refused when
        its load failed or was given up."""
        st = self.st
        self.cv.wait_for(lambda: not (st.shadow_version == v and st.shadow_state == "loading"))
        if st.shadow_version != v:
            raise _Refused(f"the shadow-load of {v} was given up (another version replaced it, "
                           f"or it was removed)")
        if st.shadow_state != "loaded":
            raise _Refused(st.reason or f"{v} was not loaded ({st.shadow_state})")

    def _on_device(self):
        if self.device.type == "cuda":  # a new thread's current device is 0
            torch.cuda.set_device(self.device)

    def _loader(self):
        self._on_device()
        st = self.st
        loading = [None, 0.0, 0.0]  # the version loading, since when, its slices' time
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self.stopping or (st.shadow_state == "loading"
                                                           and st.shadow is not None
                                                           and not self.contenders))
                if self.stopping:
                    return
                v = st.shadow_version
                if v != loading[0]:  # a new load: its time from its first slice
                    loading[:] = [v, time.perf_counter(), 0.0]
                with self.gate.alone():
                    r = self.ext.hwfs_load_slice({"slice_bytes": self.slice_bytes})
                loading[2] += r.get("slice_ms", 0) / 1000
                if not r.get("ok"):
                    logger.warning("hwfs: refused %s: %s", v, r.get("error"))
                    self._report("refused", v, reason=r.get("error"))
                elif st.shadow_state == "loaded":
                    logger.info("hwfs: worker %d loaded %s beside %s in %.3f s (slices %.3f s)",
                                self.rank, v, st.served, time.perf_counter() - loading[1],
                                loading[2])
                    self._report("loaded", v)
                if st.shadow_state != "loading":
                    loading[0] = None
                    self.cv.notify_all()
            if SLICE_PAUSE:
                time.sleep(SLICE_PAUSE)

    def _swap(self, v):
        """Serve the loaded shadow @v (holding self.cv); report the pause."""
        t0 = time.perf_counter()
        with self.gate.alone() as waited:
            r = _ok(self.ext.hwfs_swap({"version": v, "copy": self.copy_swap}))
        pause_us = max(1, int((time.perf_counter() - t0) * 1e6))
        if self.copy_swap:
            logger.info("hwfs: worker %d copied %s into the live weights", self.rank, v)
        self._served_now(v, pause_us, int(waited * 1e6), r["swap_us"])

    def _attach(self, v):
        """Serve @v on a server that serves nothing of hwfs's yet: the whole
        load, into fresh tensors, between two forward passes (the pause)."""
        t0 = time.perf_counter()
        try:
            with self.gate.alone() as waited:
                r = _ok(self.ext.hwfs_attach({"mount": self._mnt(), "version": v}))
        except _Refused as e:
            self._report("refused", v, reason=str(e))
            raise
        pause_us = max(1, int((time.perf_counter() - t0) * 1e6))
        self._served_now(v, pause_us, int(waited * 1e6), int(r.get("load_s", 0) * 1e6) or 1)

    def _served_now(self, v, pause_us, drain_us, swap_us):
        _set_served(version=v, digest=self.st.served_digest, mount=self.mount)
        self.last = {"pause_us": pause_us, "drain_us": drain_us, "swap_us": swap_us}
        self._report("swapped", v, pause_us=pause_us, drain_us=drain_us, swap_us=swap_us)
        logger.info("hwfs: worker %d serves %s (paused %d us: waited %d us for the step, swap "
                    "%d us)", self.rank, v, pause_us, drain_us, swap_us)

    def _serve_same_bytes(self, v):
        """@v's bytes are those served (another name, or the name published
        again with the same bytes): serve it under its name, pause 0."""
        self.st.served = v
        self.same_bytes = None
        _set_served(version=v, digest=self.st.served_digest, mount=self.mount)
        self._report("swapped", v, pause_us=0)

    # -- the node's events (commit-driven)
    def _events(self, w):
        self._on_device()
        while not self.stopping:
            try:
                ev = w.next(timeout=EVENT_POLL_S)
            except hwfs.StreamClosed:
                logger.warning("hwfs: the daemon of %s closed engine %s's stream; still serving "
                               "%s (init_weight_transfer_engine registers again)", self.mount,
                               self.name, self.st.served)
                return
            except ValueError:  # closed
                return
            except OSError as e:
                logger.warning("hwfs: engine events: %s", e)
                continue
            if ev is None:
                continue
            try:
                self._on_event(ev)
            except Exception as e:  # noqa: BLE001  keep serving and listening
                logger.warning("hwfs: %s %s: %s", ev.type, ev.version, _one_line(e))

    def _on_event(self, ev):
        v, st = ev.version, self.st
        with self._held():
            if ev.type in ("arrived", "prepare"):
                if self.session is not None and self.session.get("version") not in (None, v):
                    if ev.type == "prepare":
                        self._report("refused", v, reason=f"a weight update through vLLM's API "
                                     f"(of {self.session['version']}) is in progress")
                    return
                try:
                    self._want(v, self.events_mode == "in_place")
                except _Refused:
                    pass  # reported
                except OSError as e:
                    self._report("refused", v, reason=f"cannot load {v}: {e.strerror or e}")
            elif ev.type == "current" and self.flip == "driver":
                # the driver swaps (finish_weight_update): have v loaded for it
                if v != st.served and not (st.shadow_version == v and
                                           st.shadow_state in ("loading", "loaded", "checked")):
                    try:
                        self._want(v, self.events_mode == "in_place")
                    except _Refused:
                        pass  # reported; the driver's update says it again
            elif ev.type == "current":
                if st.shadow_version == v and st.shadow_state in ("loading", "loaded"):
                    self._wait_loaded(v)
                    self._swap(v)
                elif self.same_bytes == v or (st.served == v and self._map_digest(v) ==
                                              st.served_digest):
                    self._serve_same_bytes(v)
                else:
                    state = self._want(v, self.events_mode == "in_place")
                    if state == "attach":
                        self._attach(v)
                    elif state == "serving":
                        self._serve_same_bytes(v)
                    elif state == "checked":
                        self._load_in_place(v)
                    else:
                        self._wait_loaded(v)
                        self._swap(v)
            elif ev.type == "removed":
                if st.shadow_version == v and (self.session or {}).get("version") != v:
                    self.ext.hwfs_cancel({})
                    self.cv.notify_all()

    def _map_digest(self, v):
        try:
            with self._map(v) as mp:
                return mp.digest
        except OSError:
            return None

    # -- vLLM's weight-transfer API (collective_rpc on every worker)
    def init_transfer_engine(self, init_info: HwfsInitInfo) -> None:
        mount = init_info.mount or self.mount or os.environ.get("HWFS_MOUNT") or DEFAULT_MOUNT
        name = init_info.engine or (self.name and self.name.split(".rank")[0]) or \
            default_engine_name()
        with self._held():
            self.flip, self.events_mode = init_info.flip, init_info.mode
            self.copy_swap = init_info.swap == "copy"
            self.slice_bytes = SLICE_BYTES if init_info.slice_mib is None else \
                max(1, int(init_info.slice_mib * (1 << 20)))
        try:
            self._register(mount, name)
        except OSError as e:
            raise ValueError(f"hwfs: cannot register engine {self._engine_name(name)} on "
                             f"{mount}: {e.strerror or e}") from None

    def start_weight_update(self) -> None:
        with self._held():
            self.session = {}

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """{"version": V[, "mode": "in_place"]} (one dict; the API's list form
        is resolved by the worker)."""
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: HwfsUpdateInfo) -> None:
        v = update_info.version
        with self._held():
            if self.session is None:
                self.session = {}
            try:
                if update_info.mode == "in_place":
                    self._load_in_place(v)
                    self.session = {"version": None}
                    return
                self.session = {"version": v, "state": self._want(v)}
            except OSError as e:
                self.session = None  # vLLM ends the update too
                raise ValueError(f"hwfs: cannot load {v}: {e.strerror or e}") from None
            except _Refused as e:
                self.session = None
                raise ValueError(f"hwfs: refused {v}: {e}") from None

    def _load_in_place(self, v):
        st = self.st
        if not st.attached:
            self._attach(v)
            return
        if st.shadow is not None:
            self.ext.hwfs_cancel({})
            self.cv.notify_all()
        t0 = time.perf_counter()
        with self._map(v) as mp:
            digest = mp.digest
        if digest == st.served_digest:
            self._serve_same_bytes(v)
            return
        self._report("loading", v)
        with self.gate.alone() as waited:
            r = self.ext.hwfs_load_inplace({"version": v, "mount": self._mnt()})
        if not r.get("ok"):
            self._report("refused", v, reason=r.get("error"))
            raise _Refused(r.get("error"))
        pause_us = max(1, int((time.perf_counter() - t0) * 1e6))
        self._served_now(v, pause_us, int(waited * 1e6), r["swap_us"])

    def finish_weight_update(self) -> None:
        with self._held():
            s, self.session = self.session or {}, None
            v = s.get("version")
            if v is None:
                return
            try:
                if s["state"] == "serving":
                    if self.st.served != v:
                        self._serve_same_bytes(v)
                    return
                if s["state"] == "attach":
                    self._attach(v)
                    return
                self._wait_loaded(v)
                self._swap(v)
            except _Refused as e:
                self.session = s  # vLLM keeps the update open: update again, or finish again
                raise ValueError(f"hwfs: cannot serve {v}: {e}") from None

    def shutdown(self) -> None:
        """Unregister from the node (the weights served stay)."""
        self._unregister()
        with self._held():
            if self.st.shadow is not None:
                self.ext.hwfs_cancel({})

    def status(self):
        st = self.st
        with self._held():
            return {"engine": self.name, "mount": self.mount, "served": st.served,
                    "served_digest": st.served_digest, "shadow": st.shadow_version,
                    "state": st.shadow_state, "reason": st.reason, "left": len(st.todo),
                    "standby": st.standby_version, "session": self.session, **self.last}


def worker_status(worker):
    """The hwfs state of a worker (collective_rpc(worker_status) in tests and tools)."""
    eng = getattr(worker, "weight_transfer_engine", None)
    out = {"served": served_info()}
    if isinstance(eng, HwfsWeightTransferEngine):
        out.update(eng.status())
    return json.loads(json.dumps(out, default=str))


# --------------------------------------------------------------------------
# the trainer side: WeightTransferTrainerFactory's "hwfs"


@dataclass
class HwfsTrainerInitInfo(TrainerInitInfo):
    """What the trainer passes (every rank; rank 0 drives the servers).

    mount: the trainer node's hwfs mount (default $HWFS_MOUNT, else /hotweights);
    engine: the name the server registers under (default: the server's own);
    in_place: servers load in place (no shadow copy; the engine loop waits);
    drive: "routes" (start, update {"version"}, finish on the client's
        server) or "commit" (`hwfs commit V`: every node's engines load V,
        the commit waits for them, and `current` flips on every node);
    prefix: the name of an unnamed round's version: PREFIX + a number;
    files: other files of each version ({path in the version: bytes, str, or
        a file to copy}: config.json, the tokenizer), so that a version is a
        model directory vLLM can start from."""
    backend = "hwfs"
    mount: str | None = None
    engine: str | None = None
    in_place: bool = False
    drive: str = "routes"
    prefix: str = "step-"
    files: dict | None = None


class HwfsTrainerWeightTransferEngine(TrainerWeightTransferEngine[HwfsTrainerInitInfo]):
    """The trainer side.  send_weights() publishes the trainer's weights as a
    new version of the mount (hwfs.torch.publish, a collective: every rank
    writes its own shards, DTensors included, no gather; only the bytes that
    changed are new in the store, and only those travel to other nodes), then
    rank 0 has the servers serve it: through the routes of the client's
    server, or by `hwfs commit V` (every node, all or none).  The weights
    never cross the client's wire: the servers map them from their node's
    store.  send_weights(version) alone (no weights, no source) serves a
    version already published."""

    init_info_cls = HwfsTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        if init_info.drive not in ("routes", "commit"):
            raise ValueError(f"hwfs: drive is \"routes\" or \"commit\", not "
                             f"{init_info.drive!r}")
        eng = cls(client=client, source=source, is_sender=init_info.is_sender)
        eng.info = init_info
        eng.round = None  # the number of the last unnamed round
        if eng.is_sender and client is not None:
            client.init_weight_transfer_engine({"mount": init_info.mount,
                                                "engine": init_info.engine})
        return eng

    def _mount(self):
        return hwfs.open(self.info.mount or os.environ.get("HWFS_MOUNT") or DEFAULT_MOUNT)

    def _next_version(self):
        """PREFIX + the number after the highest of the mount's PREFIX<n>
        (the same on every rank: rank 0's, when torch.distributed runs)."""
        if self.round is None:
            n = 0
            if self.is_sender or not torch.distributed.is_initialized():
                pat = re.compile(re.escape(self.info.prefix) + r"(\d+)$")
                with self._mount() as m:
                    n = max((int(x.group(1)) for v in m.versions()
                             if (x := pat.match(v.name))), default=0)
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                box = [n]
                torch.distributed.broadcast_object_list(box, src=0)
                n = box[0]
            self.round = n
        self.round += 1
        return f"{self.info.prefix}{self.round:06d}"

    def send_weights(self, weights=None, version=None) -> str:
        """Publish @weights (an nn.Module, a state dict, or (name, tensor)
        pairs; default: the source given at trainer_init) as @version
        (default PREFIX + the next number), then serve it.  With neither
        weights nor a source, serve @version, already published.  Returns
        the version's name."""
        if isinstance(weights, str) and version is None:  # send_weights("v7")
            weights, version = None, weights
        if weights is None:
            weights = self.source
        if weights is None and version is None:
            raise ValueError("hwfs: send_weights(weights, version): the weights to publish "
                             "(or a source at trainer_init), or the name of a version "
                             "published on the mount")
        if weights is not None:
            from hwfs.trainers import publish
            if isinstance(weights, torch.nn.Module):
                weights = weights.state_dict()
            elif not hasattr(weights, "items"):
                weights = dict(weights)
            if version is None:
                version = self._next_version()
            with self._mount() as m:
                publish(weights, version, m, files=self.info.files)
        if self.is_sender:
            self._serve(version)
        return version

    def _serve(self, version):
        if self.info.drive == "commit":
            with self._mount() as m:
                r = m.call({"op": "commit", "version": version})
            if not r.get("ok"):
                raise RuntimeError(f"hwfs: commit {version}: {r.get('error') or r}")
            return
        upd = {"version": version}
        if self.info.in_place:
            upd["mode"] = "in_place"
        self.client.start_weight_update()
        self.client.update_weights(upd)
        self.client.finish_weight_update(version)


def _register_self():
    """--load-format hwfs, when this module was imported before hwfs.vllm_plugin
    could register it (an import that began here reached vLLM's loader module);
    the backend "hwfs" on both factories, in any process that imports this
    module: a trainer script is no vLLM process (vLLM's plugin loader does not
    run there), and it imports HwfsTrainerInitInfo from here to name the
    backend (WeightTransferTrainerFactory.trainer_init looks it up)."""
    from hwfs import vllm_plugin
    mod = sys.modules.get("vllm.model_executor.model_loader")
    if "load format" in vllm_plugin._registered and mod is not None:
        vllm_plugin._guarded("load format", vllm_plugin._register_loader, mod)
    if "backend" not in vllm_plugin._registered:
        vllm_plugin._registered.add("backend")
        vllm_plugin._guarded("weight-transfer backend", vllm_plugin._register_backend)


_register_self()
