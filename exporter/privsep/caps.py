"""Capabilities, in one place: what a task holds (``/proc/<pid>/status``), ``prctl`` and
``capset`` through ctypes, and the environment a helper process is started with.  Shared by the
serving process (``counter.drop_all``, the CLI's ``lower_effective``, ``importers/spawn.py``) and
by the helpers' boot scripts (``child.BOOT``: the counting process, ``importers/worker.BOOT``:
the import worker, ``importers/capture_run.SUPERVISOR``: a trigger command's supervisor).

A ``BOOT`` runs under ``python -I -S`` before the package is on ``sys.path``, so the shared code
is source text, ``SOURCE``: each boot script starts with it, and this module runs the same text for
the functions it exports.  It imports only ``ctypes`` and ``os``.
"""

from __future__ import annotations

import os

SOURCE = '''\
import ctypes as _ctypes
_libc = _ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [_ctypes.c_int] + [_ctypes.c_ulong] * 4
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 4, 24, 38, 47
PR_SET_CHILD_SUBREAPER = 36
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_SETPCAP = 8

def prctl(option, arg=0):
    """prctl(option, arg, 0, 0, 0); OSError (its errno) when it fails."""
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = _ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed (errno {err})")

def capabilities(pid="thread-self"):
    """CapInh, CapPrm, CapEff, CapBnd, CapAmb of a task (/proc/<pid>/status); OSError when they
    cannot be read (fail closed: what cannot be read is never taken for nothing held)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Cap"):
                    key, _, value = line.partition(":")
                    out[key] = int(value.strip(), 16)
    except ValueError as exc:
        raise OSError(f"/proc/{pid}/status: a malformed capability set ({exc})") from None
    missing = {"CapInh", "CapPrm", "CapEff"} - set(out)
    if missing:
        raise OSError(f"/proc/{pid}/status has no {', '.join(sorted(missing))}")
    return out

def capset(effective, permitted, inheritable):
    """This thread's three sets (_LINUX_CAPABILITY_VERSION_3, 64 bits each); OSError when refused."""
    lo, hi = 0xFFFFFFFF, 32
    data = (_ctypes.c_uint32 * 6)(effective & lo, permitted & lo, inheritable & lo,
                                  effective >> hi, permitted >> hi, inheritable >> hi)
    if _libc.capset((_ctypes.c_uint32 * 2)(0x20080522, 0), data) != 0:
        err = _ctypes.get_errno()
        raise OSError(err, f"capset failed (errno {err})")

def restrict(keep=0):
    """Keep at most ``keep`` (a mask) of what this thread holds, for good: no_new_privs (an
    execve as uid 0 would give the bounding set back), the bounding set down to ``keep`` where
    it may (CAP_SETPCAP, raised into the effective set for it first), ambient cleared, permitted
    and effective the part of ``keep`` held, inheritable empty.  OSError when a step that must
    succeed fails, or when more than ``keep`` is left."""
    held = capabilities()
    prm, inh = held.get("CapPrm", 0), held.get("CapInh", 0)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if prm & (1 << CAP_SETPCAP):
        capset(prm, prm, inh)  # an emptied effective set (lower_effective) could not drop the bounding set
    for cap in range(64):
        if not keep >> cap & 1:
            _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP: it stays
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before Linux 4.3: none
    have = prm & keep
    capset(have, have, 0)
    left = capabilities()
    if (left.get("CapPrm", 0) | left.get("CapEff", 0)) & ~keep or left.get("CapAmb", 0) or left.get("CapInh", 0):
        raise OSError(f"capabilities left: {left}")

def lower_effective():
    """Empty this thread's effective set, keeping the permitted and inheritable ones (and so the
    ambient one): the thread acts without its capabilities until ``restrict`` or an execve."""
    held = capabilities()
    if held.get("CapEff", 0):
        capset(0, held.get("CapPrm", 0), held.get("CapInh", 0))
'''

_ns: dict = {"__name__": __name__}
exec(compile(SOURCE, f"{__file__}:SOURCE", "exec"), _ns)  # the same text the BOOTs start with
prctl = _ns["prctl"]
capabilities = _ns["capabilities"]
capset = _ns["capset"]
restrict = _ns["restrict"]
lower_effective = _ns["lower_effective"]
PR_SET_DUMPABLE = _ns["PR_SET_DUMPABLE"]
PR_SET_PDEATHSIG = _ns["PR_SET_PDEATHSIG"]
PR_CAP_AMBIENT = _ns["PR_CAP_AMBIENT"]
PR_CAP_AMBIENT_CLEAR_ALL = _ns["PR_CAP_AMBIENT_CLEAR_ALL"]


def child_env() -> dict[str, str]:
    """A helper's environment: empty but ``LD_LIBRARY_PATH`` (an interpreter that needs it)."""
    lib = os.environ.get("LD_LIBRARY_PATH")
    return {"LD_LIBRARY_PATH": lib} if lib else {}
