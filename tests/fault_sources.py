"""Sources that misbehave on purpose, for the daemon's fault tests (registered by the tests)."""

from __future__ import annotations

import threading
from typing import ClassVar

from exporter.sources.base import Device, PollResult

RELEASE = threading.Event()  # set by a test's teardown so hung worker threads can finish


def _dev(n: int) -> Device:
    return Device(key=f"0000:0{n}:00.0", vendor="nvidia", index=str(n), mapping="testsrc",
                  uuid=f"GPU-TEST-{n}", model="Test GPU")


class GoodSource:
    name: ClassVar[str] = "good"

    def __init__(self, context=None):  # a SourceContext (registry.create_source)
        self.polls = 0

    def open(self) -> None:
        pass

    def poll(self) -> PollResult:
        self.polls += 1
        s = PollResult(devices=[_dev(0)])
        s.add(_dev(0).key, "util", 42.0)
        s.add(_dev(0).key, "energy_mj", 1000.0 * self.polls)
        return s

    def close(self) -> None:
        pass


class HangingSource(GoodSource):
    name: ClassVar[str] = "hanging"

    def poll(self) -> PollResult:
        RELEASE.wait()
        return PollResult()


class RaisingSource(GoodSource):
    name: ClassVar[str] = "raising"

    def poll(self) -> PollResult:
        raise RuntimeError("library exploded")


class FlakySource(GoodSource):
    """Device 1 is lost on every second poll; device 0 always answers."""

    name: ClassVar[str] = "flaky"

    def poll(self) -> PollResult:
        self.polls += 1
        s = PollResult(devices=[_dev(0), _dev(1)])
        s.add(_dev(0).key, "util", 10.0)
        if self.polls % 2:
            s.add(_dev(1).key, "util", 20.0)
        else:
            s.device_up[_dev(1).key] = False
            s.errors["device_lost"] += 1
        return s
