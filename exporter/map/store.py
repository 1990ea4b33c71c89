"""Latest state of every source: its devices, canonical series (frames per GPU) and health.

Each full poll replaces a source's frames as a whole, so a value that a source stops reporting
(lost GPU, failed upstream, timed-out poll) disappears instead of being served stale.  Fast polls
lay their values on top (``fast``), for the indicators only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..model import Device, Frames, SourceStats, frame_count


@dataclass
class SourceState:
    """What a source last reported (devices, series) and how it is to be read; its health and
    counters are ``stats``, the object its runner owns and counts in."""

    name: str
    explicit: bool = False          # enabled by --collector.<name> or the config file
    secondary: bool = False         # upstream scrape: native sources win for the same GPU
    provides_identity: bool = True  # fdinfo does not: it borrows identity by PCI address
    interval: float = 0.0           # seconds between full polls (0: not scheduled, e.g. a test)
    stats: SourceStats = field(default_factory=SourceStats)
    devices: dict[str, Device] = field(default_factory=dict)
    device_up: dict[str, bool] = field(default_factory=dict)
    # the last full poll's series per GPU (what the exposition shows), and what fast polls
    # refreshed since (for the indicators only, laid on top of ``frames``; emptied by each full
    # poll).  Both are replaced, never mutated: readers keep the objects they were handed.
    frames: Frames = field(default_factory=dict)
    fast: Frames = field(default_factory=dict)
    # the last full poll's PollResult.self_samples (the exposition exports the declared ones)
    self_samples: list[tuple[str, tuple[tuple[str, str], ...], float]] = field(default_factory=list)

    def clear(self) -> None:
        self.frames = {}
        self.fast = {}
        self.self_samples = []
        self.stats.up = False

    def series_count(self) -> int:
        """How many canonical series the last full poll gave."""
        return frame_count(self.frames)

    def carry_from(self, prev: SourceState) -> None:
        """Serve what ``prev`` (the same source before a reload) had until this one polls: its
        devices and frames, and its stats (health and every counter, copied into this state's
        own ``stats`` object, the one its runner counts in)."""
        self.devices, self.device_up, self.frames = prev.devices, prev.device_up, prev.frames
        self.stats.carry_from(prev.stats)


class Store:
    """Source states in a fixed order (the order of enabling); the order decides identity."""

    def __init__(self) -> None:
        self.sources: dict[str, SourceState] = {}
        self.version = 0  # bumped on every change; the renderer skips unchanged versions
        self.fast_version = 0  # bumped when a fast poll lays new values on top (the indicators read them)

    def add(self, st: SourceState) -> None:
        self.sources[st.name] = st

    def touch(self) -> None:
        self.version += 1

    def identity_owner(self, dev: Device, asking: str) -> Device | None:
        """The device as a native identity source knows it (same PCI key or uuid), if any."""
        for st in self.sources.values():
            if st.name == asking or not st.provides_identity or st.secondary:
                continue
            found = st.devices.get(dev.key)
            if found is not None:
                return found
            if dev.uuid:
                for other in st.devices.values():
                    if other.uuid == dev.uuid:
                        return other
        return None

    def resolve_devices(self, st: SourceState, devices: list[Device]) -> dict[str, Device]:
        """Give a source's devices their canonical identity; drop upstream duplicates of native ones."""
        out: dict[str, Device] = {}
        for dev in devices:
            owner = self.identity_owner(dev, st.name)
            if owner is not None:
                if st.secondary:
                    continue  # read natively already: native wins
                if not st.provides_identity:
                    dev = replace(dev, vendor=owner.vendor, index=owner.index, uuid=owner.uuid)
            out[dev.key] = dev
        return out

    def info_devices(self) -> list[tuple[str, Device]]:
        """(source, device) for gpu_info: one per canonical identity, first source wins."""
        seen: set[tuple[str, str, str]] = set()
        out = []
        for st in self.sources.values():
            if not st.provides_identity:
                continue
            for dev in st.devices.values():
                ident = dev.id
                if ident in seen:
                    continue
                seen.add(ident)
                out.append((st.name, dev))
        return out
