# SPDX-License-Identifier: MIT
"""The package itself: every public name documented, the library found as
documented ($KVPULL_LIB, the tree, the system), no compiled code."""
import inspect
import os
import subprocess
import sys

import pytest

from conftest import REPO

import kvpull

PKG = os.path.join(REPO, "python")


def _public_members(cls):
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in ("__init__",):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if inspect.isfunction(member) or isinstance(member, property):
            yield name, member


def test_every_public_name_has_a_docstring():
    assert (kvpull.__doc__ or "").strip()
    missing = []
    for name in kvpull.__all__:
        obj = getattr(kvpull, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            if not (obj.__doc__ or "").strip():
                missing.append(name)
        if inspect.isclass(obj) and obj.__module__.startswith("kvpull"):
            for mname, member in _public_members(obj):
                if not (member.__doc__ or "").strip():
                    missing.append("%s.%s" % (name, mname))
    assert missing == []
    for mod in ("_lib", "_structs", "_buf", "enums", "errors", "layout",
                "plan", "agent", "_handle"):
        assert (sys.modules["kvpull." + mod].__doc__ or "").strip(), mod


def test_pure_python():
    files = [f for _, _, fs in os.walk(os.path.join(PKG, "kvpull"))
             for f in fs if not f.endswith((".py", ".pyc"))]
    assert files == []


def _lib_path(env):
    p = subprocess.run([sys.executable, "-c",
                        "import kvpull; print(kvpull.lib_path)"],
                       capture_output=True, text=True, env=env, cwd="/")
    return p.returncode, p.stdout.strip(), p.stderr


def test_library_lookup_order(tmp_path):
    env = dict(os.environ, PYTHONPATH=PKG)
    env.pop("KVPULL_LIB", None)
    status, path, err = _lib_path(env)
    assert status == 0, err
    assert path == os.path.join(REPO, "build", "libkvpull.so.0")
    real = os.path.join(REPO, "build", "libkvpull.so.0.2.0")
    status, path, err = _lib_path(dict(env, KVPULL_LIB=real))
    assert (status, path) == (0, real), err
    status, _, err = _lib_path(dict(env, KVPULL_LIB=str(tmp_path / "no.so")))
    assert status == 1 and "OSError" in err


def test_version():
    assert kvpull.version() == (0, 2, 0)
    assert kvpull.__version__ == "%d.%d.%d" % kvpull.version()
    out = subprocess.run([os.path.join(REPO, "build", "tools",
                                       "kvpull-plan"), "--version"],
                         capture_output=True, text=True).stdout
    assert out == "kvpull-plan %s\n" % kvpull.__version__


@pytest.mark.parametrize("name", ["Error", "Layout", "Plan", "Request",
                                  "Agent", "Event"])
def test_exported(name):
    assert name in kvpull.__all__ and hasattr(kvpull, name)
    assert issubclass(kvpull.Error, OSError)


def test_library_of_another_release_refused():
    from kvpull import _lib
    _lib.check_abi(0x000200)
    _lib.check_abi(0x000207)  # a patch release: same structs
    for other, name in ((0x000100, "0.1.0"), (0x000300, "0.3.0"),
                        (0x010200, "1.2.0")):
        with pytest.raises(ImportError) as e:
            _lib.check_abi(other)
        assert str(e.value) == (
            "%s is kvpull %s; this binding mirrors kvpull 0.2's structs: "
            "load a library of that release (KVPULL_LIB)"
            % (_lib.lib_path, name))
