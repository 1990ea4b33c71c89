"""Installs the test suite's network guard (uge_netguard.py) in every Python process the tests
start: this folder is first on their PYTHONPATH (tests/conftest.py).  The sitecustomize it
shadows (the system's) still runs after it."""

import os
import sys

if os.environ.get("UGE_NETGUARD_LOG"):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import uge_netguard

        uge_netguard.install()
    finally:
        del sys.path[0]

_here = os.path.dirname(os.path.abspath(__file__))
for _dir in list(sys.path):
    _candidate = os.path.join(_dir or os.getcwd(), "sitecustomize.py")
    if os.path.abspath(_dir or os.getcwd()) != _here and os.path.isfile(_candidate):
        with open(_candidate, encoding="utf-8") as _f:
            exec(compile(_f.read(), _candidate, "exec"), {"__name__": "sitecustomize", "__file__": _candidate})
        break
