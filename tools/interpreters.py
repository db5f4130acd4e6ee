"""The interpreters the generators read: every $(pyenv root)/versions/* interpreter, and those
that tools/pythons.sh made (its manifest, $SCALENE_RS_CACHE/interpreters.txt: Debian's own
builds in a chroot, free-threaded builds).
"""
import glob
import os
import subprocess
from collections import namedtuple

CACHE = os.environ.get("SCALENE_RS_CACHE", os.path.expanduser("~/.cache/scalene-rs"))

# label: for messages; exe: the command that runs it; root: the directory it runs chrooted in
# ("/" when none): a path it reports (its include directory) is under root on this machine.
Interpreter = namedtuple("Interpreter", "label exe root")


def pyenv_root():
    root = os.environ.get("PYENV_ROOT")
    if root:
        return root
    try:
        return subprocess.check_output(["pyenv", "root"]).decode().strip()
    except (OSError, subprocess.CalledProcessError):
        return os.path.expanduser("~/.pyenv")


def pyenv_interpreters():
    found = []
    for d in glob.glob(os.path.join(pyenv_root(), "versions", "*")):
        parts = os.path.basename(d).split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            exe = os.path.join(d, "bin", "python%s.%s" % (parts[0], parts[1]))
            if os.path.exists(exe):
                key = (int(parts[0]), int(parts[1]), os.path.basename(d))
                found.append((key, Interpreter("pyenv-" + os.path.basename(d), exe, "/")))
    return [i for _, i in sorted(found)]


def made_interpreters():
    """Those listed in tools/pythons.sh's manifest (none when it was not run)."""
    path = os.path.join(CACHE, "interpreters.txt")
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) >= 2 and os.path.exists(cols[1]):
                out.append(Interpreter(cols[0], cols[1], cols[2] if len(cols) > 2 else "/"))
    return out


def all_interpreters():
    return pyenv_interpreters() + made_interpreters()


def host_path(interp, path):
    """`path` as the interpreter reported it, as a path on this machine."""
    if interp.root in ("", "/"):
        return path
    return os.path.join(interp.root, path.lstrip("/"))
