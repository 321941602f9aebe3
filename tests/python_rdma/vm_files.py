#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Print, space-separated, the host paths scripts/rxe-vm.sh must copy into
its VM (--files) for tests/python_rdma to run there: this interpreter and
the ELF files it needs (rxe-vm.sh adds every ELF file's ldd closure), its
standard library without what the tests never import (test suites, IDLE,
tkinter, the static libpython of config-*), numpy, pytest and torch (when
installed: Debian's python3-torch, CPU) with what they import, and from this
tree the package, the library, the example and the tests; and, when
present, InferenceX's kv-transfer suite (its bench/ and configs/:
$INFERENCEX_KV, else ../shared/third_party/inferencex-kv beside the
repository), for test_inferencex.py.

torch is carried as import needs it, not whole: its Python files,
bin/torch_shm_manager (import checks it exists) and lib/
libtorch_global_deps.so (import dlopens it by that path); not its C++ test
programs (bin/*Test*, test/), headers or the other links of lib/ (some do
not resolve; copied, the rest would duplicate libtorch_cpu's 117 MB, which
the ldd closure of torch/_C already carries).

    vm_files.py [LIB] [--du]

LIB: the libkvpull.so.0 the tests load [build/libkvpull.so.0]. --du:
print the total size instead (what the initramfs grows by, uncompressed).
"""
import os
import sys
import sysconfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "turtle.py",
               "lib2to3", "ensurepip", "pydoc_data", "__pycache__",
               "site-packages", "dist-packages", "EXTERNALLY-MANAGED"}
# Imported by the tests, pytest or numpy (pytest 7.2 on Debian 12); more
# are found by importing pytest and collecting the tests below.
THIRD_PARTY = ("numpy", "pytest", "_pytest", "pluggy", "iniconfig",
               "packaging", "attr", "py", "exceptiongroup", "tomli",
               "torch", "torch.distributed")
# Parts of a package directory left out, and the files of those parts kept.
PACKAGE_SKIP = {"torch": ({"bin", "lib", "include", "test"},
                          ("bin/torch_shm_manager",
                           "lib/libtorch_global_deps.so"))}


def _top_path(mod):
    """The file or package directory of a top-level module, or None."""
    f = getattr(mod, "__file__", None)
    if not f:
        return None
    if os.path.basename(f).startswith("__init__."):
        return os.path.dirname(f)
    return f


def package_paths(path):
    """path itself, or for a package of PACKAGE_SKIP its entries without
    the skipped parts, plus the files of those parts that are kept."""
    name = os.path.basename(path)
    if name not in PACKAGE_SKIP or not os.path.isdir(path):
        return [path]
    skip, keep = PACKAGE_SKIP[name]
    out = [os.path.join(path, e) for e in sorted(os.listdir(path))
           if e not in skip]
    return out + [os.path.join(path, k) for k in keep
                  if os.path.exists(os.path.join(path, k))]


def third_party(stdlib):
    import importlib
    found = set()
    for name in THIRD_PARTY:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    try:                                # what collecting the tests imports
        import pytest
        sys.path.insert(0, os.path.join(REPO, "python"))
        pytest.main(["-q", "--collect-only", "-p", "no:cacheprovider",
                     os.path.join(REPO, "tests", "python_rdma")],
                    plugins=[])
    except Exception:                   # noqa: BLE001 (best effort)
        pass
    for name, mod in list(sys.modules.items()):
        if "." in name:
            continue
        p = _top_path(mod)
        if not p:
            continue
        p = os.path.abspath(p)
        if p.startswith(stdlib + os.sep) or p.startswith(REPO + os.sep):
            continue
        found.add(p)
    return found


def suite_paths():
    """InferenceX's kv-transfer suite's bench/ and configs/, or []."""
    for d in (os.environ.get("INFERENCEX_KV"),
              os.path.join(REPO, "..", "shared", "third_party",
                           "inferencex-kv"),
              "/work/shared/third_party/inferencex-kv"):  # a clone elsewhere
        if d and os.path.isfile(os.path.join(d, "bench", "run_kv.py")):
            d = os.path.abspath(d)
            return [os.path.join(d, "bench"), os.path.join(d, "configs")]
    return []


def main(argv):
    du = "--du" in argv
    args = [a for a in argv if a != "--du"]
    lib = os.path.abspath(args[0] if args else
                          os.path.join(REPO, "build", "libkvpull.so.0"))
    stdlib = sysconfig.get_paths()["stdlib"]
    paths = [sys.executable, os.path.realpath(sys.executable)]
    for name in sorted(os.listdir(stdlib)):
        if name in STDLIB_SKIP or name.startswith("config-"):
            continue
        paths.append(os.path.join(stdlib, name))
    stdout = sys.stdout
    sys.stdout = open(os.devnull, "w")  # pytest's collection output
    try:
        extra = third_party(stdlib)
    finally:
        sys.stdout.close()
        sys.stdout = stdout
    for p in sorted(extra):
        paths += package_paths(p)
    paths += [os.path.join(REPO, "python", "kvpull"),
              os.path.join(REPO, "python", "examples"),
              os.path.join(REPO, "tests", "python_rdma"), lib]
    paths += suite_paths()
    paths = list(dict.fromkeys(paths))
    for p in paths:
        if any(c.isspace() for c in p):
            sys.exit("vm_files.py: %r: rxe-vm.sh splits --files on "
                     "whitespace" % p)
    if du:
        total = 0
        for p in paths:
            if os.path.isdir(p):
                for d, _ds, fs in os.walk(p, followlinks=True):
                    total += sum(os.path.getsize(os.path.join(d, f))
                                 for f in fs if "__pycache__" not in d)
            else:
                total += os.path.getsize(p)
        print("%d paths, %.1f MiB (before the ldd closures)"
              % (len(paths), total / 2**20))
        return 0
    print(" ".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
