"""hwfs.vllm_plugin — what `pip install hwfs` adds to vLLM, with no patch of vLLM.

The package declares this entry point (tools/python/pyproject.toml):

    [project.entry-points."vllm.general_plugins"]
    hwfs = "hwfs.vllm_plugin:register"

vLLM calls register() once in each of its processes (the API server, the
engine core, every worker; vllm/plugins/__init__.py, load_general_plugins).
It registers (docs/engines.md, "vLLM's native weight-transfer API"):

* the load format "hwfs" (`--load-format hwfs`): hwfs.vllm_native.HwfsModelLoader;
* the weight-transfer backend "hwfs" (`--weight-transfer-config
  '{"backend": "hwfs"}'`), worker side: hwfs.vllm_native.HwfsWeightTransferEngine,
  imported only where a worker creates it;
* in the engine core, GET /weight_info's answer: the hwfs version the
  workers serve (see _hook_weight_version);
* only when HWFS_VLLM_IDLE_SPIN_MS is set: how long vLLM's shared-memory
  queue readers (the workers, the engine core) spin after a message before
  they sleep (see _hook_idle_spin).

Cheap and idempotent: nothing heavy is imported here.  The loader registers
when vLLM imports vllm.model_executor.model_loader (only workers do; an import
of it here would cost the API server seconds), the /weight_info hook when the
engine core module is there.  Nothing here raises: vLLM does not catch what a
plugin's function raises, so a failure is logged and vLLM starts without it.
When libhwfs cannot be loaded, `import hwfs` (and so this module) raises
ImportError, which vLLM logs ("Failed to load plugin hwfs") and goes on.
"""

import importlib.abc
import logging
import os
import sys

LOAD_FORMAT = "hwfs"
BACKEND = "hwfs"
IDLE_SPIN_ENV = "HWFS_VLLM_IDLE_SPIN_MS"

_log = logging.getLogger("vllm.hwfs")  # under vLLM's logger: its handler prints it
_registered = set()


def register():
    """The vllm.general_plugins entry point (idempotent; never raises)."""
    for what, fn, module in (("load format", _register_loader,
                              "vllm.model_executor.model_loader"),
                             ("/weight_info hook", _hook_weight_version, "vllm.v1.engine.core"),
                             ("idle spin", _hook_idle_spin,
                              "vllm.distributed.device_communicators.shm_broadcast")):
        if what not in _registered:
            _registered.add(what)
            _when_imported(module, what, fn)
    if "backend" not in _registered:
        _registered.add("backend")
        _guarded("weight-transfer backend", _register_backend)


def _guarded(what, fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001  vLLM must start whatever happens here
        _log.warning("hwfs: cannot register the %s: %s", what, e)


def _register_loader(module):
    native = sys.modules.get("hwfs.vllm_native")
    if native is not None and not hasattr(native, "HwfsModelLoader"):
        return  # being imported (it imports vLLM's loader): it registers itself at its end
    from hwfs.vllm_native import HwfsModelLoader
    formats = getattr(module, "_LOAD_FORMAT_TO_MODEL_LOADER", {})
    if formats.get(LOAD_FORMAT) is not HwfsModelLoader:
        module.register_model_loader(LOAD_FORMAT)(HwfsModelLoader)


def _register_backend():
    from vllm.distributed.weight_transfer.factory import (WeightTransferEngineFactory,
                                                          WeightTransferTrainerFactory)
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, "hwfs.vllm_native",
                                                    "HwfsWeightTransferEngine")
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, "hwfs.vllm_native",
                                                     "HwfsTrainerWeightTransferEngine")


def _hook_weight_version(module):
    """GET /weight_info answers EngineCore.get_weight_version(), a label the
    engine core keeps ("default" until a client sets one).  When the workers
    load through hwfs (the load format or the backend), they know which
    version they serve; these two wrappers make the label follow it: a read
    after an hwfs load or swap names the version served, and a label a
    client sets afterwards (/update_weight_version, finish_weight_update's
    weight_version) stands until the next hwfs swap.  Servers that use
    neither are not asked anything."""
    ec = getattr(module, "EngineCore", None)
    if ec is None or getattr(ec, "_hwfs_hooked", False):
        return
    get0, set0 = ec.get_weight_version, ec.set_weight_version

    def get_weight_version(self):
        info = _served(self)
        if info is not None and info["gen"] != getattr(self, "_hwfs_gen_seen", None):
            self._hwfs_gen_seen = info["gen"]
            set0(self, info["version"])
        return get0(self)

    def set_weight_version(self, weight_version):
        set0(self, weight_version)
        info = _served(self)
        if info is not None:
            self._hwfs_gen_seen = info["gen"]

    get_weight_version.__doc__ = get0.__doc__
    ec.get_weight_version, ec.set_weight_version = get_weight_version, set_weight_version
    ec._hwfs_hooked = True


def _hook_idle_spin(module):
    """vLLM's shared-memory message queue (shm_broadcast.SpinCondition) keeps
    a reader spinning on sched_yield() for busy_loop_s = 1 s after every
    message: the workers of a paused or idle server, and its engine core,
    take a core each for a second after each step or RPC.  On a host where
    the hwfs daemon shares a few cores with vLLM that is the CPU a weight
    update needs (docs/engines.md, "Few cores").  HWFS_VLLM_IDLE_SPIN_MS=N
    sets that time to N ms in every process of the server; unset, vLLM's
    own value stands."""
    raw = os.environ.get(IDLE_SPIN_ENV)
    cls = getattr(module, "SpinCondition", None)
    if not raw or cls is None or getattr(cls, "_hwfs_spin", None) is not None:
        return
    try:
        spin_s = float(raw) / 1000
    except ValueError:
        spin_s = -1.0
    if not spin_s >= 0 or spin_s == float("inf"):
        raise ValueError(f"{IDLE_SPIN_ENV}={raw!r}: not a number of milliseconds >= 0")
    init0 = cls.__init__

    def __init__(self, *args, **kw):
        init0(self, *args, **kw)
        if self.is_reader:
            self.busy_loop_s = spin_s

    __init__.__doc__ = init0.__doc__
    cls.__init__, cls._hwfs_spin = __init__, spin_s
    _log.info("hwfs: vLLM's message-queue readers spin %g ms after a message (%s)",
              spin_s * 1000, IDLE_SPIN_ENV)


def _served(core):
    """{"version", "gen"} the first worker of @core serves through hwfs, or None."""
    cfg = getattr(core, "vllm_config", None)
    wt = getattr(cfg, "weight_transfer_config", None)
    if cfg is None or (cfg.load_config.load_format != LOAD_FORMAT
                       and getattr(wt, "backend", None) != BACKEND):
        return None
    try:
        from hwfs.vllm_native import served_info
        out = core.collective_rpc(served_info, timeout=30)
    except Exception as e:  # noqa: BLE001  the label stays as it was
        _log.warning("hwfs: cannot ask the workers which version they serve: %s", e)
        return None
    return out[0] if out and isinstance(out[0], dict) else None


# -- run a function once a module is imported (at once when it is already)

def _when_imported(name, what, fn):
    mod = sys.modules.get(name)
    if mod is not None:
        _guarded(what, fn, mod)
        return
    for f in sys.meta_path:
        if isinstance(f, _AfterImport):
            f.hooks.setdefault(name, []).append((what, fn))
            return
    f = _AfterImport()
    f.hooks[name] = [(what, fn)]
    sys.meta_path.insert(0, f)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module it waits for, it wraps the loader
    the other finders give, to call the waiting functions once it ran."""

    def __init__(self):
        self.hooks = {}

    def find_spec(self, name, path=None, target=None):
        if name not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenRun(spec.loader, self.hooks.pop(name))
        return spec


class _ThenRun(importlib.abc.Loader):
    def __init__(self, loader, hooks):
        self.loader, self.hooks = loader, hooks

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        for what, fn in self.hooks:
            _guarded(what, fn, module)

    def __getattr__(self, attr):  # get_resource_reader, is_package, ...
        return getattr(self.loader, attr)
