"""Fakes of vendor library modules (same surface as the real bindings), driven by scenario data."""
