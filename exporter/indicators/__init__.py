"""Contention indicators computed on the node from canonical series (see engine.py)."""

from .config import IndicatorConfig
from .engine import DeviceId, IndicatorEngine

__all__ = ["DeviceId", "IndicatorConfig", "IndicatorEngine"]
