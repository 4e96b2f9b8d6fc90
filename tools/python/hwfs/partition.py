"""hwfs.partition — tensor-parallel slices of a mapped version, the same as
the mount's computed `versions/V/tp/<N>/<r>/model.safetensors` (fs/ns/ns_tp.c,
docs/trainers.md).

    with hwfs.open(m).map("v7", tp=(4, 1)) as shard:   # a TPMapping
        q = shard["model.layers.0.self_attn.q_proj.weight"]   # rows 1/4 .. 2/4

Each tensor gets one rule: split on dim 0 (a contiguous row range: a
zero-copy, contiguous view of the arena), split on dim 1 (a zero-copy strided
view; np.ascontiguousarray() it where a consumer needs contiguous memory),
replicated (the whole tensor), or expert (an MoE expert `...experts.<e>...`,
present only on rank e // (E // N), E the number of experts).  The rules come
from `hwfs-partition.json` at the top of the version when it has one (a JSON
object, fnmatch pattern -> 0, 1, "replicate" or "expert", the first matching
pattern in file order wins), else from the built-in rules for
Llama/Qwen/Mistral/Mixtral names (rule()).  A size that does not divide a
split tensor raises ValueError naming it, with the daemon's words.

The built-in rules are not written here: they are the table fs/ns/tp_rules.def,
the one the daemon compiles in, read at import (SPLIT) from the copy installed
beside this file, else from the repository this package sits in.
"""

import fnmatch
import json
import os
import re

from .mapping import Mapping

__all__ = ["rule", "expert_index", "rules_for", "TPMapping", "PARTITION_FILE"]

PARTITION_FILE = "hwfs-partition.json"
RULES_FILE = "tp_rules.def"
_EXPERT = re.compile(r"(?:^|\.)experts\.(\d+)(?:\.|$)")
_ROW = re.compile(r'TP_SPLIT\((\d+), "([^"\\]*)", "([^"\\]*)"\)\s*$')


def _rules_path():
    """Where tp_rules.def is: beside this file (pip, make install), else in
    the repository (tools/python/hwfs -> fs/ns)."""
    here = os.path.dirname(os.path.abspath(__file__))
    tried = [os.path.join(here, RULES_FILE),
             os.path.normpath(os.path.join(here, "..", "..", "..", "fs", "ns", RULES_FILE))]
    for p in tried:
        if os.path.isfile(p):
            return p
    raise ImportError(f"hwfs.partition: the split rules {RULES_FILE} are missing (looked in "
                      f"{' and '.join(tried)}): reinstall the package")


def _read_rules(path):
    """The TP_SPLIT rows of @path: a tuple of (component, dim, suffix), in file order."""
    rows = []
    with open(path) as f:
        for line in f:
            if not line.startswith("TP_SPLIT("):
                continue
            m = _ROW.match(line)
            if not m or m.group(1) not in ("0", "1"):
                raise ImportError(f"{path}: not a TP_SPLIT(0|1, \"component\", \"suffix\") "
                                  f"row: {line.strip()}")
            rows.append((m.group(2), int(m.group(1)), m.group(3)))
    if not rows:
        raise ImportError(f"{path}: no TP_SPLIT row")
    return tuple(rows)


# The built-in rows: (component, dim, suffix), the first whose component a name holds decides.
SPLIT = _read_rules(_rules_path())


def expert_index(name):
    """The expert index of an MoE expert tensor (`experts.<e>.`), or -1."""
    m = _EXPERT.search(name)
    return int(m.group(1)) if m else -1


def _has(name, comp):
    return comp in name.split(".")


def rule(name, ndim):
    """The built-in rule of tensor @name with @ndim dims: 0, 1, "replicate" or
    "expert" (SPLIT's first row whose component @name holds: its dim when
    @ndim is larger and @name ends with its suffix)."""
    if expert_index(name) >= 0:
        return "expert"
    for comp, dim, suffix in SPLIT:
        if _has(name, comp):
            return dim if ndim > dim and name.endswith(suffix) else "replicate"
    return "replicate"


def rules_for(infos, overrides=None):
    """{name: rule} for TensorInfos @infos (first of each name), with the
    hwfs-partition.json object @overrides (a dict, in file order) first."""
    if overrides is not None:
        for pat, val in overrides.items():
            if val not in (0, 1, "replicate", "expert") or isinstance(val, bool):
                raise ValueError(f"{PARTITION_FILE}: pattern \"{pat}\": the rule must be 0, 1, "
                                 f"\"replicate\" or \"expert\"")
    out = {}
    for ti in infos:
        if ti.name in out:
            continue
        r = rule(ti.name, len(ti.shape))
        for pat, val in (overrides or {}).items():
            if fnmatch.fnmatchcase(ti.name, pat):
                r = val
                break
        out[ti.name] = r
    return out


class TPMapping:
    """Rank r's slices of every tensor of a mapped version for TP size N
    (hwfs.Mount.map(V, tp=(N, r))).  Dict-like by tensor name, like Mapping:
    numpy views over the arena (no copy).  Holds the underlying Mapping."""

    def __init__(self, mapping, tp, overrides=None):
        n, r = (int(x) for x in tp)
        if not 1 <= n or not 0 <= r < n:
            raise ValueError(f"tp=({n}, {r}): need N >= 1 and 0 <= r < N")
        self.mapping, self.size, self.rank = mapping, n, r
        self.version = mapping.version
        infos = mapping.tensors()
        self.rules = rules_for(infos, overrides)
        experts = max([expert_index(k) for k in self.rules] + [-1]) + 1
        self._names = []
        for ti in infos:
            if ti.name in self._names:
                continue
            kind = self.rules[ti.name]
            if kind in (0, 1):
                if len(ti.shape) <= kind:
                    raise ValueError(f"tensor {ti.name}: has {len(ti.shape)} dims, cannot be "
                                     f"split on dim {kind}")
                if ti.shape[kind] % n:
                    raise ValueError(f"tensor {ti.name}: dim {kind} of size {ti.shape[kind]} "
                                     f"does not divide by {n}")
            elif kind == "expert":
                e = expert_index(ti.name)
                if e < 0:
                    raise ValueError(f"tensor {ti.name}: an expert rule, but no experts.<e> "
                                     f"in its name")
                if experts % n:
                    raise ValueError(f"tensor {ti.name}: {experts} experts do not divide by {n}")
                if e // (experts // n) != r:
                    continue
            self._names.append(ti.name)

    def close(self):
        self.mapping.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<hwfs.TPMapping {self.version} tp={self.size} rank {self.rank}>"

    def array(self, key):
        """Tensor @key's slice for this rank: a read-only numpy view (no copy)."""
        if key not in self._names:
            raise KeyError(f"version {self.version} has no tensor {key!r} for tp rank "
                           f"{self.rank} of {self.size}")
        a = self.mapping.array(key)
        kind = self.rules[key]
        if kind in (0, 1):
            k = a.shape[kind] // self.size
            idx = [slice(None)] * a.ndim
            idx[kind] = slice(self.rank * k, (self.rank + 1) * k)
            return a[tuple(idx)]
        return a

    __getitem__ = array

    def __contains__(self, key):
        return key in self._names

    # the rest of the dict protocol is Mapping's (over self._names and self[key])
    __iter__, __len__ = Mapping.__iter__, Mapping.__len__
    keys, values, items = Mapping.keys, Mapping.values, Mapping.items

    def get(self, key, default=None):
        return self[key] if key in self._names else default


def read_overrides(mountpoint, version):
    """The hwfs-partition.json object of @version on the mount (None when it has none)."""
    p = os.path.join(mountpoint, "versions", version, PARTITION_FILE)
    try:
        with open(p) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        js = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{PARTITION_FILE}: {e}") from None
    if not isinstance(js, dict):
        raise ValueError(f"{PARTITION_FILE}: not a JSON object")
    return js
