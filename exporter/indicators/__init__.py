"""Contention indicators computed on the node from canonical series (see engine.py)."""

from .config import IndicatorConfig
from .engine import DeviceId, IndicatorEngine
from .signals import USED_SERIES

__all__ = ["USED_SERIES", "DeviceId", "IndicatorConfig", "IndicatorEngine"]
