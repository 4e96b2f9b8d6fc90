"""Packaging of the Python package (tools/python, its setup.py).

`pip install ./tools/python` into a fresh venv builds libhwfs from the
repository's C sources into the package (hwfs/libhwfs.so.1), and that package
works with neither `make install` nor HWFS_LIBRARY, from outside the repository,
against a real mount; the build leaves nothing in the source tree that git
sees.  `python -m build` makes an sdist that carries the C sources (csrc/) and,
from that sdist, a platform wheel holding the library, which installs into a
second venv without building anything.

The venvs see the system's site-packages (numpy, setuptools).  pip builds the
way a user's pip does (an isolated build environment, setuptools from the
index); only when that cannot reach the index does the test build without
isolation, with the setuptools the venv sees.
"""

import os
import platform
import shutil
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
import pytest

from conftest import REPO, save_model

PYDIR = REPO / "tools" / "python"
NO_INDEX = ("Could not find a version that satisfies", "No matching distribution",
            "Failed to establish a new connection", "Temporary failure in name resolution",
            "Network is unreachable")
# What the bundled library may link: jansson, xxhash and the C library.
ALLOWED_NEEDED = ("libjansson.so.", "libxxhash.so.", "libc.so.", "libdl.so.", "libpthread.so.",
                  "ld-linux")
SONAME = "libhwfs.so.1"


def env_without_hwfs():
    """The environment of a user's shell: no HWFS_LIBRARY, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("HWFS_LIBRARY", "PYTHONPATH")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore")
    return env


def run(args, timeout=240, **kw):
    cp = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                        env=env_without_hwfs(), **kw)
    return cp


def make_venv(path, own_pip=True):
    """A venv on the system's site-packages; without @own_pip it runs the
    system's pip (and so builds with the system's setuptools and wheel)."""
    cp = run([sys.executable, "-m", "venv", "--system-site-packages",
              *([] if own_pip else ["--without-pip"]), path], timeout=120)
    assert cp.returncode == 0, cp.stderr
    return path / "bin" / "python"


def offline(cp):
    return cp.returncode != 0 and any(s in cp.stdout + cp.stderr for s in NO_INDEX)


def pip_install_in_new_venv(path, what):
    """A user's path: a fresh venv, `pip install WHAT` (isolated build, setuptools
    from the index).  Without an index: a venv that runs the system's pip,
    `--no-build-isolation` (a fresh venv's own setuptools may be too old to build)."""
    py = make_venv(path)
    args = ["-m", "pip", "install", "-q", what]
    cp = run([py, *args])
    if offline(cp):
        shutil.rmtree(path)
        py = make_venv(path, own_pip=False)
        cp = run([py, *args, "--no-build-isolation"])
    assert cp.returncode == 0, f"pip install {what}\n{cp.stdout}\n{cp.stderr}"
    return py


def site_packages(py):
    cp = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"])
    assert cp.returncode == 0, cp.stderr
    return cp.stdout.strip()




def git_dirt():
    """What `git status` shows under tools/python (None outside a git checkout)."""
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        return None
    cp = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=all",
                         "--", "tools/python"], capture_output=True, text=True, timeout=60)
    return cp.stdout if cp.returncode == 0 else None


def publish_v1(mount, tmp_path):
    mount.run("publish", str(save_model(tmp_path / "src" / "m.safetensors",
                                        {"w": np.arange(6, dtype=np.float32)}).parent), "v1")


# Imported from outside the repository: which library, and one real map.
PROBE = """
import hwfs, hwfs._lib as L, sys
print(L.path)
print(hwfs.__file__)
with hwfs.open(sys.argv[1]) as m, m.map("v1") as v:
    print(v["w"].tolist())
"""


def probe(py, mount, cwd):
    cp = run([py, "-c", PROBE, mount.mnt], timeout=60, cwd=cwd)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout.split("\n")[:3]


def needed(lib):
    cp = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    return [ln.split("[", 1)[1].rstrip("]") for ln in cp.stdout.splitlines() if "(NEEDED)" in ln]


@pytest.mark.limit(300)
def test_pip_install_bundles_libhwfs(mount, tmp_path):
    before = git_dirt()
    py = pip_install_in_new_venv(tmp_path / "venv", PYDIR)
    assert git_dirt() == before, "pip install left files in tools/python that git sees"

    site = site_packages(py)
    lib = os.path.join(site, "hwfs", SONAME)
    assert os.path.isfile(lib), os.listdir(os.path.join(site, "hwfs"))
    bad = [n for n in needed(lib) if not n.startswith(ALLOWED_NEEDED)]
    assert not bad, f"{lib} links more than jansson, xxhash and libc: {bad}"

    publish_v1(mount, tmp_path)
    work = tmp_path / "elsewhere"  # not the repository: no build tree to fall back on
    work.mkdir()
    path, module, values = probe(py, mount, work)
    assert path == lib, f"hwfs loaded {path}, not the library bundled in {site}"
    assert module.startswith(site), module
    assert values == "[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]"

    # The console script of the vLLM worker extension: the entry point only
    # (hwfs/_vllm_cli.py is another part of the package).
    cp = run([py, "-c", "from importlib.metadata import entry_points; "
              "print([e.value for e in entry_points(group='console_scripts') if e.name == 'hwfs-vllm'])"],
             cwd=work)
    assert cp.stdout.strip() == "['hwfs._vllm_cli:main']", cp.stdout + cp.stderr
    assert (py.parent / "hwfs-vllm").exists()


@pytest.mark.limit(300)
def test_build_makes_an_sdist_with_the_c_sources_and_a_platform_wheel(mount, tmp_path):
    # Asked from tmp_path, not from the repository, whose folder build/ would pass for
    # the module (a namespace package with no __main__).
    has = run([sys.executable, "-c", "import build.__main__"], cwd=tmp_path)
    if has.returncode != 0:
        pytest.fail("python -m build needs the package build (tools/install/install-deps.sh installs it): "
                    + has.stderr)
    dist = tmp_path / "dist"
    before = git_dirt()
    # No --sdist/--wheel: build makes the sdist, then the wheel from the sdist
    # (so the wheel's library is compiled from csrc/, not from the repository).
    args = [sys.executable, "-m", "build", "--outdir", dist, PYDIR]
    cp = run(args, cwd=tmp_path)
    if offline(cp):  # no index for the isolated build: the setuptools this Python has
        cp = run([*args, "--no-isolation"], cwd=tmp_path)
    assert cp.returncode == 0, f"{cp.stdout}\n{cp.stderr}"
    assert git_dirt() == before, "python -m build left files in tools/python that git sees"

    sdists, wheels = sorted(dist.glob("hwfs-*.tar.gz")), sorted(dist.glob("hwfs-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, os.listdir(dist)
    with tarfile.open(sdists[0]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for f in ("setup.py", "pyproject.toml", "hwfs/_lib.py", "csrc/fs/lib/libhwfs.c",
              "csrc/fs/lib/libhwfs.map", "csrc/fs/common/ctl.c", "csrc/fs/common/util.c",
              "csrc/fs/common/hwfs_common.h", "csrc/gpu/cudart.c", "csrc/include/hwfs.h"):
        assert f in names, f"the sdist lacks {f}: {sorted(names)}"

    whl = wheels[0]
    tag = whl.name[:-len(".whl")].split("-")[-3:]
    assert tag[:2] == ["py3", "none"] and tag[2] == f"linux_{platform.machine()}", whl.name
    with zipfile.ZipFile(whl) as z:
        assert f"hwfs/{SONAME}" in z.namelist(), z.namelist()
        assert "Root-Is-Purelib: false" in z.read(
            next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode()

    py = make_venv(tmp_path / "venv2")
    cp = run([py, "-m", "pip", "install", "-q", "--no-index", whl])  # nothing to build or fetch
    assert cp.returncode == 0, cp.stderr
    site = site_packages(py)
    publish_v1(mount, tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    path, module, values = probe(py, mount, work)
    assert path == os.path.join(site, "hwfs", SONAME) and module.startswith(site), (path, module)
    assert values == "[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]"
