"""A GPU's health, one definition (``definition.py``), and the node-problem-detector plugin that
asks the local exporter for it (``probe.py``, ``unified-gpu-exporter health --node``)."""
