"""Where `make install` puts the Python package hwfs, asked of the Python that
will import it (the Makefile's PYTHON, default python3).

    python_dir.py PREFIX        print the site directory for PREFIX
    python_dir.py --check DIR   print a note on stderr when PYTHON does not
                                look in DIR (exit 0 either way)

The directory is, in this order (decision, issue 26; docs/operations.md):

1. a directory of PYTHON's sys.path that is PREFIX/lib.../site-packages or
   dist-packages: where that Python already looks for PREFIX (Debian's python3
   and PREFIX=/usr/local: /usr/local/lib/python3.11/dist-packages; a venv or a
   pyenv/python.org Python and PREFIX=its prefix: its site-packages);
2. otherwise `sysconfig.get_path("purelib", "posix_prefix", {base, platbase:
   PREFIX})`: PREFIX/lib/python3.X/site-packages, the directory a Python
   installed in PREFIX would use.  Debian's default scheme (posix_local) is not
   asked: it adds `local/` (PREFIX/local/lib/...).

`$(PREFIX)/lib/python3/dist-packages`, where the package went before, is on
the path of Debian's own python3 only, and only for PREFIX=/usr.
"""

import os
import sys
import sysconfig


def site_dir(prefix):
    """The site directory for @prefix (see the module's text)."""
    prefix = os.path.normpath(os.path.abspath(prefix))
    for p in sys.path:
        if not p:
            continue
        p = os.path.normpath(os.path.abspath(p))
        if os.path.basename(p) not in ("site-packages", "dist-packages"):
            continue
        rel = os.path.relpath(p, prefix)
        if rel.split(os.sep)[0] in ("lib", "lib64"):
            return p
    scheme = "posix_prefix" if "posix_prefix" in sysconfig.get_scheme_names() else None
    return sysconfig.get_path("purelib", scheme, vars={"base": prefix, "platbase": prefix})


def check(d):
    """A note on stderr when this Python does not import from @d."""
    d = os.path.normpath(os.path.abspath(d))
    if any(p and os.path.normpath(os.path.abspath(p)) == d for p in sys.path):
        return
    print(f"note: {sys.executable} does not look in {d}: for it, `pip install ./tools/python`, "
          f"or set PYTHONPATH={d} (another Python: make install PYTHON=/path/to/python3)",
          file=sys.stderr)


def main(argv):
    if len(argv) == 3 and argv[1] == "--check":
        check(argv[2])
        return 0
    if len(argv) != 2 or argv[1].startswith("-"):
        print("usage: python_dir.py PREFIX | --check DIR", file=sys.stderr)
        return 2
    print(site_dir(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
