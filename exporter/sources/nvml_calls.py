"""Guarded NVML calls: classify each NVML error, remember what a device cannot do.

NVML reports a missing capability as an error code, per call and per field.  The rules here:

* NotSupported / FunctionNotFound / ArgumentVersionMismatch / Deprecated (and the binding's
  ``NVMLLibraryMismatchError``): the series is omitted, counted once as ``not_supported`` for
  that (device, field) and never asked again.
* NoPermission: remembered the same way, counted once as ``read_error``.
* GpuIsLost / Unknown / ResetRequired / GpuNotFound: ``DeviceLost`` is raised so the caller marks
  the whole GPU down for this poll; other GPUs continue.
* Timeout: counted as ``timeout``; anything else as ``read_error``; both are retried next poll.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

# NVML return codes (nvml.h; identical in pynvml's NVML_ERROR_* constants)
SUCCESS = 0
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
ARGUMENT_VERSION_MISMATCH = 25
DEPRECATED = 26
GPU_NOT_FOUND = 28
UNKNOWN = 999

UNSUPPORTED_CODES = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH, DEPRECATED})
LOST_CODES = frozenset({GPU_IS_LOST, UNKNOWN, RESET_REQUIRED, GPU_NOT_FOUND})


class DeviceLost(Exception):
    """The GPU stopped answering (GpuIsLost, Unknown...): stop reading it for this poll."""

    def __init__(self, code: int) -> None:
        super().__init__(f"NVML error {code}")
        self.code = code


class CallGuard:
    """Calls NVML functions by name, turning errors into counts and remembered gaps."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.skipped: set[tuple[str, str]] = set()
        self.no_permission: set[tuple[str, str]] = set()  # the skipped ones refused with NoPermission
        self._mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)

    # -- bookkeeping -------------------------------------------------------------------------
    def remember(self, errors: Counter[str], key: str, field: str, kind: str = "not_supported") -> bool:
        """Mark (key, field) as never-again; count it once.  Returns True the first time."""
        if (key, field) in self.skipped:
            return False
        self.skipped.add((key, field))
        errors[kind] += 1
        return True

    def is_skipped(self, key: str, field: str) -> bool:
        return (key, field) in self.skipped

    def failure_reason(self, key: str, field: str) -> str:
        """Why the last call of (key, field) gave nothing: ``no_permission``, ``not_supported``
        (also a binding without the function) or ``read_error`` (retried next poll)."""
        if (key, field) in self.no_permission:
            return "no_permission"
        if (key, field) in self.skipped:
            return "not_supported"
        return "read_error"

    def handle_code(self, errors: Counter[str], key: str, field: str, code: int) -> None:
        """Account for one failed NVML return code; raises DeviceLost for lost-GPU codes."""
        if code in LOST_CODES:
            raise DeviceLost(code)
        if code in UNSUPPORTED_CODES:
            self.remember(errors, key, field)
        elif code == NO_PERMISSION:
            self.no_permission.add((key, field))
            self.remember(errors, key, field, "read_error")
        elif code == TIMEOUT:
            errors["timeout"] += 1
        else:
            errors["read_error"] += 1

    # -- calls -------------------------------------------------------------------------------
    def call(self, errors: Counter[str], key: str, field: str, fn_name: str, *args: Any,
             empty_codes: Sequence[int] = (), empty: Any = None) -> Any:
        """Call ``nvml.<fn_name>(*args)``; None when it failed or is known unsupported.

        ``empty_codes``: return codes that mean "no data right now" (returns ``empty``).
        """
        if (key, field) in self.skipped:
            return None
        fn: Callable[..., Any] | None = getattr(self.nvml, fn_name, None)
        if fn is None:  # binding older than the function
            self.remember(errors, key, field)
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", UNKNOWN)
            if code in empty_codes:
                return empty
            self.handle_code(errors, key, field, code)
            return None
        except Exception as exc:  # NVMLLibraryMismatchError and friends
            if self._mismatch is not None and isinstance(exc, self._mismatch):
                self.remember(errors, key, field)
            else:
                errors["read_error"] += 1
            return None

    def call_first(self, errors: Counter[str], key: str, field: str,
                   variants: Sequence[tuple[str, tuple[Any, ...]]]) -> Any:
        """Try API variants in order (newest first); an unsupported variant is skipped later on.

        The field is counted as not supported once, when the last variant turns out unsupported.
        """
        if (key, field) in self.skipped:
            return None
        for i, (fn_name, args) in enumerate(variants):
            vkey = f"{field}#{i}"
            if (key, vkey) in self.skipped:
                continue
            fn = getattr(self.nvml, fn_name, None)
            if fn is None:
                self.skipped.add((key, vkey))
                continue
            try:
                return fn(*args)
            except self.nvml.NVMLError as exc:
                code = getattr(exc, "value", UNKNOWN)
                if code in UNSUPPORTED_CODES:
                    self.skipped.add((key, vkey))
                    continue
                self.handle_code(errors, key, field, code)
                return None
            except Exception as exc:
                if self._mismatch is not None and isinstance(exc, self._mismatch):
                    self.skipped.add((key, vkey))
                    continue
                errors["read_error"] += 1
                return None
        self.remember(errors, key, field)
        return None
