"""Build step of the hwfs package: compile libhwfs into the package.

The package carries its own libhwfs (hwfs/libhwfs.so.1), built here from the
C sources of the client library, with the flags and the version script of the
repository's Makefile (CLIENT_OBJS, the libhwfs.so rule, INC_LIB), so that
`pip install ./tools/python` works in any environment without `make install`
or HWFS_LIBRARY.  It carries the tensor-parallel split rules of the daemon
too (fs/ns/tp_rules.def, as hwfs/tp_rules.def: hwfs/partition.py reads them).
The metadata is in pyproject.toml.

Where the C sources come from:
  * csrc/ next to this file, when it exists: an sdist (the sdist command below
    copies them there, into the release tree only, never into tools/python);
  * else the repository this directory sits in (tools/python -> ../..).

It needs a C compiler and the headers and libraries of jansson and libxxhash
(plus DLPack's header): Debian's build-essential pkg-config libjansson-dev
libxxhash-dev libdlpack-dev.  When one is missing the build stops with one line
saying which packages to install.  At run time the library needs only
libjansson4 and libxxhash0 (and libc).

The wheel holds a shared library and no Python extension: it is tagged
py3-none-PLATFORM (any Python 3, this platform only).
"""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

try:  # setuptools >= 70.1 has bdist_wheel itself
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools: the wheel package's (none: no wheel to tag)
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CSRC = os.path.join(HERE, "csrc")
LIBNAME = "libhwfs.so.1"  # the soname (Makefile LIBHWFS_SONAME)

# The client library: what the Makefile's CLIENT_OBJS compiles, and the headers
# those sources include (fs/lib/*.c, ctl.c, util.c, gpu/cudart.c).  Paths are
# relative to the repository root, and to csrc/ in an sdist.
C_GLOBS = ("fs/lib",)  # every .c and .h of these folders, and the version script
C_FILES = ("fs/common/ctl.c", "fs/common/ctl.h", "fs/common/util.c", "fs/common/hwfs_common.h",
           "fs/common/names.h", "gpu/cudart.c", "gpu/cudart.h", "include/hwfs.h")
VERSION_SCRIPT = "fs/lib/libhwfs.map"
# Data files of the repository the package carries beside its modules, and their
# name there: the tensor-parallel split rules the daemon compiles in and
# hwfs/partition.py reads (in an sdist under csrc/ too).
PACKAGE_DATA = {"fs/ns/tp_rules.def": "tp_rules.def"}
INC_LIB = ("include", "fs/common", "gpu", "fs/lib")  # the Makefile's INC_LIB
CLIENT_PKGS = ("jansson", "libxxhash")  # the Makefile's CLIENT_PKGS
# The Makefile's REQ_CFLAGS (-Werror only for a build from the repository: an
# sdist may meet a newer compiler with new warnings) and the client objects' own.
REQ_CFLAGS = ["-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-pthread",
              "-D_FILE_OFFSET_BITS=64"]
CLIENT_CFLAGS = ["-fPIC", "-fvisibility=hidden"]
DEB_BUILD = "build-essential pkg-config libjansson-dev libxxhash-dev libdlpack-dev"


def source_files(root):
    """The C sources and headers of the client library under @root (relative paths)."""
    out = []
    for d in C_GLOBS:
        for f in sorted(os.listdir(os.path.join(root, d))):
            if f.endswith((".c", ".h", ".map")):
                out.append(f"{d}/{f}")
    return out + list(C_FILES) + list(PACKAGE_DATA)


def stage_sources(root, dest):
    """Copy source_files(@root) under @dest (the layout of an sdist's csrc/); returns @dest."""
    for rel in source_files(root):
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        shutil.copyfile(os.path.join(root, rel), os.path.join(dest, rel))
    return dest


def source_root():
    """(root, from_repo): csrc/ of an sdist, else the repository."""
    if os.path.isfile(os.path.join(CSRC, VERSION_SCRIPT)):
        return CSRC, False
    if os.path.isfile(os.path.join(REPO, VERSION_SCRIPT)):
        return REPO, True
    fail(f"the C sources of libhwfs are missing: neither {CSRC} nor {REPO}/fs/lib "
         "(build from the hwfs repository, or from its sdist)")


def fail(msg):
    # One line, no traceback: pip prints it among its own output.
    sys.stderr.write(f"error: hwfs: {msg}\n")
    raise SystemExit(1)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


class BuildLibhwfs:
    """Compile the client sources and link LIBNAME, as the Makefile does."""

    def __init__(self, root, werror, tmp):
        self.root, self.tmp = root, tmp
        self.cc = shlex.split(os.environ.get("CC") or "cc")  # the Makefile's CC ?= cc
        # The user's CFLAGS/LDFLAGS first (the Makefile's default CFLAGS is -O2 -g),
        # then the flags libhwfs needs.
        self.cflags = shlex.split(os.environ.get("CFLAGS", "-O2 -g")) + REQ_CFLAGS + \
            (["-Werror"] if werror else [])
        self.ldflags = shlex.split(os.environ.get("LDFLAGS", ""))
        self.pkg_cflags, self.pkg_libs = self.dependencies()

    def dependencies(self):
        """pkg-config's flags for CLIENT_PKGS (plain -l flags without pkg-config),
        after checking that each header and library is there: one line naming
        the Debian packages to install when one is not."""
        if not shutil.which(self.cc[0]):
            fail(f"no C compiler ({self.cc[0]}) to build libhwfs: apt-get install {DEB_BUILD}")
        cflags, libs = [], ["-ljansson", "-lxxhash"]
        if shutil.which("pkg-config"):
            cp = run(["pkg-config", "--cflags", *CLIENT_PKGS])
            if cp.returncode == 0:
                cflags = shlex.split(cp.stdout)
                libs = shlex.split(run(["pkg-config", "--libs", *CLIENT_PKGS]).stdout)
        checks = (("jansson.h", "-ljansson", "json_object", "libjansson-dev"),
                  ("xxhash.h", "-lxxhash", "XXH3_128bits", "libxxhash-dev"),
                  ("dlpack/dlpack.h", None, None, "libdlpack-dev"))
        missing = []
        for header, lib, sym, deb in checks:
            prog = os.path.join(self.tmp, "check.c")
            with open(prog, "w") as f:
                f.write(f"#include <{header}>\n")
                f.write(f"int main(void) {{ return (int)(long)(void *){sym}; }}\n" if sym
                        else "int main(void) { return 0; }\n")
            args = [*self.cc, *cflags, prog, "-o", os.path.join(self.tmp, "check")]
            if lib:
                args += [*self.ldflags, *libs]
            if run(args).returncode != 0:
                missing.append(deb)
        if missing:
            fail(f"cannot build libhwfs: missing the headers or libraries of {', '.join(missing)}: "
                 f"apt-get install {DEB_BUILD}")
        return cflags, libs

    def build(self, out):
        inc = [f"-I{os.path.join(self.root, d)}" for d in INC_LIB]
        objs = []
        for rel in source_files(self.root):
            if not rel.endswith(".c"):
                continue
            obj = os.path.join(self.tmp, rel[:-2].replace("/", "_") + ".o")
            args = [*self.cc, *self.cflags, *self.pkg_cflags, *inc, *CLIENT_CFLAGS, "-c",
                    "-o", obj, os.path.join(self.root, rel)]
            print(" ".join(shlex.quote(a) for a in args))
            cp = run(args)
            if cp.returncode != 0:
                sys.stderr.write(cp.stdout + cp.stderr)
                fail(f"compiling {rel} failed (the compiler's messages are above)")
            objs.append(obj)
        args = [*self.cc, *self.ldflags, "-pthread", "-shared", f"-Wl,-soname,{LIBNAME}",
                f"-Wl,--version-script={os.path.join(self.root, VERSION_SCRIPT)}",
                "-Wl,--no-undefined", "-o", out, *objs, *self.pkg_libs, "-pthread", "-ldl"]
        print(" ".join(shlex.quote(a) for a in args))
        cp = run(args)
        if cp.returncode != 0:
            sys.stderr.write(cp.stdout + cp.stderr)
            fail(f"linking {LIBNAME} failed (the linker's messages are above)")


class build_py_with_lib(build_py):
    """build_py, then hwfs/libhwfs.so.1 and PACKAGE_DATA into the build tree
    beside the modules."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # pip install -e: the package finds the repository's build/ and fs/ instead
        root, from_repo = source_root()
        dest = os.path.join(self.build_lib, "hwfs", LIBNAME)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        for rel, name in PACKAGE_DATA.items():
            shutil.copyfile(os.path.join(root, rel), os.path.join(self.build_lib, "hwfs", name))
        with tempfile.TemporaryDirectory(prefix="hwfs-build-") as tmp:
            if from_repo:
                # Compile a copy of exactly the files an sdist carries, so that a
                # header missing from C_FILES fails here too, not only in an sdist.
                root = stage_sources(root, os.path.join(tmp, "csrc"))
            BuildLibhwfs(root, from_repo, tmp).build(dest)

    def get_outputs(self, include_bytecode=True):
        out = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return out
        return out + [os.path.join(self.build_lib, "hwfs", n)
                      for n in (LIBNAME, *PACKAGE_DATA.values())]


class sdist_with_csrc(sdist):
    """The sdist carries the C sources in csrc/ (copied into the release tree
    only: tools/python is left as it is)."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root, _ = source_root()
        stage_sources(root, os.path.join(base_dir, "csrc"))


if bdist_wheel is not None:
    class bdist_wheel_platform(bdist_wheel):
        """A platform wheel for any Python 3: the .so is no Python extension."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # install into platlib; never a pure wheel


cmdclass = {"build_py": build_py_with_lib, "sdist": sdist_with_csrc}
if bdist_wheel is not None:
    cmdclass["bdist_wheel"] = bdist_wheel_platform
setup(distclass=BinaryDistribution, cmdclass=cmdclass)
