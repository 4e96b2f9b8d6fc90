"""hwfs.vllm — shadow-load hwfs versions inside vLLM's workers, swap between engine steps.

WorkerExtension is the loading core of vLLM's weight-transfer backend "hwfs"
(hwfs.vllm_native, which runs its methods on each worker's model; hwfs-vllm,
hwfs/_vllm_cli.py, drives that backend).  It is written as a vLLM worker
extension: each method is named hwfs_*, takes one JSON string or a dict, and
returns a JSON-able dict; failures come back as {"ok": false, "error": "one
line"}, never as an exception.

The design (docs/engines.md, "hwfs-vllm"):

* A shadow-load is sliced: hwfs_prepare maps the version (zero-copy,
  libhwfs) and checks it, then each hwfs_load_slice call loads at most
  `slice_bytes` of tensors and returns.  A slice loads through the model's
  own `load_weights` (so stacked qkv/gate_up parameters, TP sharding and name
  mapping are the model's) with every parameter's `.data` pointed at its
  shadow tensor for the length of the call only: the live tensors are never
  written.  No forward pass may run during a call (it reads `param.data`
  too): the backend runs the slices on a thread of the worker behind a gate
  that the model's forward hooks take (hwfs.vllm_native._Gate), so serving
  runs between the slices.
* hwfs_swap points every parameter at its shadow (`param.data = shadow`) in
  one call, on every worker: between two steps.  The previous tensors stay
  as the standby (hwfs_rollback swaps back at once) until the next
  shadow-load, which reuses their memory: at most one more copy of the
  weights than vLLM itself holds.
* Kernel formats: a swap of `param.data` is seen by the forward pass only
  where the forward pass reads the parameter.  That holds for unquantized
  layers on CUDA (without CUDA graphs: launch with --enforce-eager, since a
  captured graph keeps the old addresses; or pass "copy" swaps, which copy
  into the live storage).  vLLM's CPU backend repacks linear weights
  (oneDNN / sgl handlers, `layer.cpu_linear`) after loading and drops the
  parameter; hwfs_attach gives those layers their checkpoint-format
  parameter back (the storage load_weights writes), and each version's
  kernels are packed by vLLM's own dispatch on it: after the last tensor of
  a shadow-load, a slice of layers per call, swapped with the parameters.
  Quantized layers whose parameters are repacked are refused at attach.
* Low-memory mode (hwfs_load_inplace): no shadow; the version is loaded into
  the live parameters at the commit, while the caller holds requests: the
  pause is the whole load.
"""

import json
import time

import torch

import hwfs
from hwfs.torch import _view, torch_dtype

__all__ = ["WorkerExtension"]

DEFAULT_SLICE_BYTES = 64 << 20


def _shape(s):
    return [int(x) for x in s]


def _sig(mapping):
    """{name: (dtype, shape)} of a mapped version's tensors."""
    return {ti.name: (ti.dtype, tuple(ti.shape)) for ti in mapping.tensors()}


def _misfit(sig, served, version):
    """The reason @sig (the new version) does not fit @served, or None."""
    for name in sorted(served.keys() | sig.keys()):
        a, b = served.get(name), sig.get(name)
        if a == b:
            continue
        if b is None:
            return f"tensor {name}: missing from {version}, model has {a[0]} {_shape(a[1])}"
        if a is None:
            return f"tensor {name}: {b[0]} {_shape(b[1])} in {version}, not in the served model"
        if a[1] != b[1]:
            return f"tensor {name}: shape {_shape(b[1])} in {version}, model has {_shape(a[1])}"
        return f"tensor {name}: dtype {b[0]} in {version}, model has {a[0]}"
    return None


class _State:
    """Per-worker hwfs state (one per worker process)."""

    def __init__(self):
        self.attached = False
        self.params = []          # [(name, Parameter)] in named_parameters order
        self.served = None        # version the live parameters hold
        self.served_sig = None
        self.standby = None       # [tensor] per param: the previous version's storage
        self.standby_version = None
        self.served_digest = None  # the versions' digests (a name may be used again)
        self.standby_digest = None
        self.shadow_digest = None
        self.shadow = None        # [tensor] per param
        self.shadow_version = None
        self.shadow_state = "idle"  # idle, loading, loaded, refused
        self.reason = None
        self.mapping = None
        self.todo = []            # names left to load
        self.filled = set()       # parameters the load wrote so far (load_weights says)
        # CPU: layers whose forward reads a repacked copy (cpu_linear), as
        # (module, index of its weight in params); per version, their kernels
        self.klayers = []
        self.kern = None          # live kernels, one per klayers entry
        self.shadow_kern = None
        self.standby_kern = None
        self.pack_todo = []       # klayers indices left to pack for the shadow
        self.total = 0
        self.last_swap_us = None
        self.converted = 0


def _one_line(e):
    s = str(e).strip().replace("\n", " ") or type(e).__name__
    return s[:480]


class WorkerExtension:
    """The loading core, shaped as a vLLM worker extension: names start with
    hwfs_ (vLLM refuses a name the worker already has); _hwfs_model() is the
    model (hwfs.vllm_native._Ext gives its own)."""

    # -- helpers
    def _hwfs(self):
        st = getattr(self, "_hwfs_state", None)
        if st is None:
            st = _State()
            self._hwfs_state = st
        return st

    def _hwfs_model(self):
        return self.model_runner.get_model()

    def _hwfs_call(self, fn, arg):
        try:
            req = json.loads(arg) if isinstance(arg, str) and arg else (arg or {})
            out = fn(self._hwfs(), req)
            out.setdefault("ok", True)
            return out
        except Exception as e:  # one line back to the caller, the worker keeps serving
            return {"ok": False, "error": _one_line(e)}

    def _hwfs_convert(self, st):
        """Put every layer on parameters the forward pass reads (see the module doc).

        Returns [(module, pname, old_param, new_param, old_cpu_linear)] of the
        parameters materialized (registered, not yet filled), to undo or finish."""
        from vllm.platforms import current_platform
        try:
            from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
            from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor
            from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs
        except ImportError:  # older vLLM: no record of the checkpoint format
            LAYERWISE_INFO = {}
            materialize_meta_tensor = restore_layer_refs = None
        model = self._hwfs_model()
        made = []
        for mname, mod in model.named_modules():
            qm = getattr(mod, "quant_method", None)
            if qm is not None and "Unquantized" not in type(qm).__name__:
                raise ValueError(f"layer {mname}: quantized ({type(qm).__name__}): hwfs "
                                 f"swaps checkpoint-format parameters only")
            info = LAYERWISE_INFO.get(mod) if hasattr(LAYERWISE_INFO, "get") else None
            meta = info.restore_metadata[0] if info is not None else {}
            if current_platform.is_cpu() and hasattr(mod, "cpu_linear"):
                w = mod._parameters.get("weight")
                if w is not None and w.numel() == 0 and "weight" in meta \
                        and materialize_meta_tensor is not None:
                    with torch.device(str(w.device)):
                        new = materialize_meta_tensor(meta["weight"])
                    new = restore_layer_refs(new, mod)
                    new.requires_grad_(False)
                    mod.register_parameter("weight", new)
                    made.append((mod, "weight", w, new, mod.cpu_linear))
                else:
                    made.append((mod, None, None, None, mod.cpu_linear))
                continue
            for pname, m in meta.items():
                p = mod._parameters.get(pname)
                if p is not None and (tuple(p.shape) != tuple(m.shape) or p.dtype != m.dtype):
                    raise ValueError(f"parameter {mname}.{pname}: repacked after loading "
                                     f"({_shape(m.shape)} -> {_shape(p.shape)}): hwfs "
                                     f"swaps checkpoint-format parameters only")
        return made

    def _hwfs_load(self, st, names, targets):
        """Load tensors @names of st.mapping through the model's load_weights
        into @targets (a tensor per st.params entry; None: the live ones)."""
        model = self._hwfs_model()
        live = [p.data for _, p in st.params]
        try:
            if targets is not None:
                for (_, p), t in zip(st.params, targets):
                    p.data = t
            with torch.no_grad():
                done = model.load_weights((n, _view(st.mapping, n)) for n in names)
            if isinstance(done, set):
                st.filled |= done
        finally:
            if targets is not None:
                for (_, p), t in zip(st.params, live):
                    p.data = t
        if targets is not None and any(t.device.type == "cuda" for t in targets[:1]):
            torch.cuda.synchronize(targets[0].device)

    def _hwfs_check_filled(self, st, version):
        """Refuse a load that left a parameter unwritten (when the model says
        which it loaded: vLLM's load_weights returns their names)."""
        if st.filled:
            left = [n for n, _ in st.params if n not in st.filled]
            if left:
                raise ValueError(f"parameter {left[0]}: no tensor of {version} loads it")

    def _hwfs_open(self, st, req):
        """Map the version of @req, check it against the served one."""
        version = req["version"]
        mapping = req.get("_mapping")  # mapped by the caller (hwfs.vllm_native), or:
        if mapping is None:
            m = hwfs.open(req["mount"])
            try:
                mapping = m.map(version)
            finally:
                m.close()
        sig = _sig(mapping)
        if st.served_sig is not None:
            why = _misfit(sig, st.served_sig, version)
            if why:
                mapping.close()
                raise ValueError(why)
        for ti in mapping.tensors():
            torch_dtype(ti.dtype)  # TypeError names a dtype torch lacks
        return mapping, sig

    # -- the calls
    def hwfs_attach(self, arg=""):
        """{"mount", "version", "in_place"}: make this worker hwfs's (once per
        server start) and load @version into it; all in this one call, so the
        first step after it serves @version whole.  in_place: the live
        parameters already hold @version (vLLM loaded it from the mount):
        load into them, no second copy, and keep vLLM's packed kernels."""
        def run(st, req):
            if st.attached:
                return {"served": st.served, "attached": False}
            t0 = time.perf_counter()
            mapping, sig = self._hwfs_open(st, req)
            digest = mapping.digest
            made = self._hwfs_convert(st)
            in_place = bool(req.get("in_place"))
            try:
                st.params = list(self._hwfs_model().named_parameters())
                st.mapping, st.filled = mapping, set()
                fresh = None if in_place else [torch.empty_like(p.data) for _, p in st.params]
                self._hwfs_load(st, list(mapping), fresh)
                self._hwfs_check_filled(st, req["version"])
            except BaseException:
                for mod, pname, old, _new, _lin in made:
                    if pname is not None:
                        mod.register_parameter(pname, old)
                st.params, st.mapping = [], None
                mapping.close()
                raise
            index = {id(p): i for i, (_, p) in enumerate(st.params)}
            st.klayers = [(mod, index[id(mod.weight)]) for mod, *_ in made]
            if in_place:  # vLLM packed them from these very weights
                kern = [lin for *_, lin in made]
            else:
                kern = [self._hwfs_pack(mod, fresh[i]) for mod, i in st.klayers]
                for (_, p), t in zip(st.params, fresh):
                    p.data = t
            for (mod, _i), k in zip(st.klayers, kern):
                mod.cpu_linear = k
            st.kern = kern
            mapping.close()
            st.mapping = None
            st.attached, st.served, st.served_sig = True, req["version"], sig
            st.served_digest = digest
            st.converted = len(made)
            return {"served": st.served, "attached": True, "converted": len(made),
                    "load_s": round(time.perf_counter() - t0, 3)}
        return self._hwfs_call(run, arg)

    def hwfs_prepare(self, arg=""):
        """{"mount", "version", "low_memory"}: map @version and check that it
        fits the served model (a refusal names the tensor); then, unless
        low_memory, get shadow storage (the standby's, if any) for the slices."""
        def run(st, req):
            if not st.attached:
                raise ValueError("worker not attached (hwfs_attach first)")
            spare = st.shadow  # a shadow overtaken by this one: reuse its memory
            self._hwfs_drop_shadow(st)
            st.shadow_version, st.shadow_state, st.reason = req["version"], "loading", None
            try:
                st.mapping, _sig_unused = self._hwfs_open(st, req)
            except Exception as e:
                st.shadow_state, st.reason = "refused", _one_line(e)
                raise
            st.todo, st.filled = list(st.mapping), set()
            st.total = sum(ti.nbytes for ti in st.mapping.tensors())
            st.shadow_digest = st.mapping.digest
            if (st.standby is not None and st.standby_version == st.shadow_version
                    and st.standby_digest == st.shadow_digest and not req.get("low_memory")):
                # the standby is this version (a commit back): loaded as it is
                self._hwfs_release_mapping(st)
                st.shadow, st.standby, st.standby_version = st.standby, None, None
                st.shadow_kern, st.standby_kern = st.standby_kern, None
                st.shadow_state = "loaded"
                return {"version": st.shadow_version, "bytes": st.total, "loaded": True,
                        "left": 0}
            if req.get("low_memory"):
                self._hwfs_release_mapping(st)  # hwfs_load_inplace maps it again
                st.shadow_state = "checked"
                return {"version": st.shadow_version, "bytes": st.total}
            if spare is not None:
                st.shadow = spare
            elif st.standby is not None:  # reuse the previous version's memory
                st.shadow, st.standby, st.standby_version = st.standby, None, None
                st.standby_digest, st.standby_kern = None, None
            else:
                st.shadow = [torch.empty_like(p.data) for _, p in st.params]
            return {"version": st.shadow_version, "bytes": st.total, "tensors": len(st.todo)}
        return self._hwfs_call(run, arg)

    def hwfs_load_slice(self, arg=""):
        """{"slice_bytes"}: load the next tensors of the prepared version into
        the shadow, at most slice_bytes (at least one tensor); {"left": N}."""
        def run(st, req):
            if st.shadow_state != "loading" or st.shadow is None:
                raise ValueError(f"no shadow-load in progress (state {st.shadow_state})")
            limit = int(req.get("slice_bytes") or DEFAULT_SLICE_BYTES)
            if st.mapping is None:  # loaded: repack the kernels, a slice at a time
                return self._hwfs_pack_slice(st, limit)
            names, size = [], 0
            while st.todo and (not names or size + st.mapping.info(st.todo[0]).nbytes <= limit):
                n = st.todo.pop(0)
                names.append(n)
                size += st.mapping.info(n).nbytes
            t0 = time.perf_counter()
            try:
                self._hwfs_load(st, names, st.shadow)
                if not st.todo:
                    self._hwfs_check_filled(st, st.shadow_version)
            except Exception as e:
                st.shadow_state, st.reason = "refused", f"cannot load {st.shadow_version}: {_one_line(e)}"
                self._hwfs_release_mapping(st)
                raise ValueError(st.reason) from None
            if not st.todo:
                self._hwfs_release_mapping(st)
                st.shadow_kern = [None] * len(st.klayers)
                st.pack_todo = list(range(len(st.klayers)))
                if not st.pack_todo:
                    st.shadow_state = "loaded"
            return {"version": st.shadow_version, "left": len(st.todo) + len(st.pack_todo),
                    "loaded": len(names), "slice_ms": round((time.perf_counter() - t0) * 1000, 3)}
        return self._hwfs_call(run, arg)

    def hwfs_swap(self, arg=""):
        """{"version", "copy"}: serve the loaded shadow of @version: every
        parameter's storage swapped to its shadow (copy: the shadow copied
        into the live storage, through one scratch tensor, for CUDA graphs),
        the previous storage kept as the standby.  Returns swap_us."""
        def run(st, req):
            v = req["version"]
            if st.shadow_version != v or st.shadow_state != "loaded":
                raise ValueError(f"{v} is not loaded here (shadow {st.shadow_version}: "
                                 f"{st.shadow_state})")
            t0 = time.perf_counter_ns()
            if req.get("copy"):
                for (_, p), s in zip(st.params, st.shadow):
                    tmp = p.data.clone()
                    p.data.copy_(s)
                    s.copy_(tmp)
                if st.params and st.params[0][1].device.type == "cuda":
                    torch.cuda.synchronize()
                old = st.shadow
            else:
                old = []
                for (_, p), s in zip(st.params, st.shadow):
                    old.append(p.data)
                    p.data = s
            old_kern = self._hwfs_set_kern(st, st.shadow_kern)
            t1 = time.perf_counter_ns()
            st.standby_kern, st.shadow_kern = old_kern, None
            st.standby, st.standby_version = old, st.served
            st.standby_digest, st.served_digest = st.served_digest, st.shadow_digest
            st.served, st.shadow, st.shadow_version, st.shadow_state = v, None, None, "idle"
            pass  # served_sig stays: the same names, shapes and dtypes: prepare checked
            st.last_swap_us = max(1, (t1 - t0) // 1000)
            return {"served": v, "swap_us": st.last_swap_us, "standby": st.standby_version}
        return self._hwfs_call(run, arg)

    def hwfs_rollback(self, arg=""):
        """Serve the standby again (the version served before the last swap)."""
        def run(st, req):
            if st.standby is None:
                raise ValueError("no standby version to roll back to")
            t0 = time.perf_counter_ns()
            old = []
            for (_, p), s in zip(st.params, st.standby):
                old.append(p.data)
                p.data = s
            st.standby_kern = self._hwfs_set_kern(st, st.standby_kern)
            t1 = time.perf_counter_ns()
            st.served, st.standby_version = st.standby_version, st.served
            st.served_digest, st.standby_digest = st.standby_digest, st.served_digest
            st.standby = old
            st.last_swap_us = max(1, (t1 - t0) // 1000)
            return {"served": st.served, "swap_us": st.last_swap_us}
        return self._hwfs_call(run, arg)

    def hwfs_load_inplace(self, arg=""):
        """{"mount", "version"}: low-memory mode: load @version into the live
        parameters (the caller holds every request: the pause is this load)."""
        def run(st, req):
            v = req["version"]
            t0 = time.perf_counter_ns()
            mapping, sig = self._hwfs_open(st, req)
            st.mapping, st.filled = mapping, set()
            try:
                self._hwfs_load(st, list(mapping), None)
            finally:
                self._hwfs_release_mapping(st)
            self._hwfs_set_kern(st, [self._hwfs_pack(mod, st.params[i][1].data)
                                     for mod, i in st.klayers])
            t1 = time.perf_counter_ns()
            self._hwfs_drop_shadow(st)
            st.standby, st.standby_version, st.standby_digest = None, None, None
            st.standby_kern = None
            st.served, st.served_sig, st.served_digest = v, sig, mapping.digest
            st.last_swap_us = max(1, (t1 - t0) // 1000)
            return {"served": v, "swap_us": st.last_swap_us}
        return self._hwfs_call(run, arg)

    def hwfs_cancel(self, arg=""):
        """Drop a shadow-load in progress (or a loaded shadow)."""
        return self._hwfs_call(lambda st, req: (self._hwfs_drop_shadow(st), {})[1], arg)

    def hwfs_status(self, arg=""):
        def run(st, req):
            return {"attached": st.attached, "served": st.served, "shadow": st.shadow_version,
                    "state": st.shadow_state, "reason": st.reason,
                    "standby": st.standby_version, "left": len(st.todo),
                    "last_swap_us": st.last_swap_us, "converted": st.converted}
        return self._hwfs_call(run, arg)

    # -- internals
    def _hwfs_pack(self, mod, weight):
        """The CPU kernel of layer @mod for @weight: vLLM's own dispatch
        (oneDNN / sgl packing, or F.linear), run on a stand-in holding @weight."""
        import types
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        proxy = types.SimpleNamespace(weight=weight)
        dispatch_cpu_unquantized_gemm(proxy, remove_weight=False)
        return proxy.cpu_linear

    def _hwfs_pack_slice(self, st, limit):
        t0 = time.perf_counter()
        size = 0
        while st.pack_todo and (size == 0 or size < limit):
            k = st.pack_todo.pop(0)
            mod, i = st.klayers[k]
            st.shadow_kern[k] = self._hwfs_pack(mod, st.shadow[i])
            size += st.shadow[i].numel() * st.shadow[i].element_size()
        if not st.pack_todo:
            st.shadow_state = "loaded"
        return {"version": st.shadow_version, "left": len(st.pack_todo),
                "slice_ms": round((time.perf_counter() - t0) * 1000, 3)}

    def _hwfs_set_kern(self, st, kern):
        """Point the repacked layers at @kern (None: nothing to do); the old list."""
        if not st.klayers or kern is None:
            return None
        old = st.kern
        for (mod, _i), k in zip(st.klayers, kern):
            mod.cpu_linear = k
        st.kern = kern
        return old

    def _hwfs_release_mapping(self, st):
        if st.mapping is not None:
            st.mapping.close()
            st.mapping = None
        st.todo = []

    def _hwfs_drop_shadow(self, st):
        self._hwfs_release_mapping(st)
        st.pack_todo, st.shadow_kern = [], None
        st.shadow, st.shadow_version, st.shadow_state, st.reason = None, None, "idle", None
