"""Profiler artifacts (ncu CSV, nsys SQLite, rocprof CSV, Kineto JSON, unitrace CSV) imported into
the canonical schema.

``detect.import_file(path)`` parses one file into a ``model.Profile`` (or raises
``model.ProfileRejected`` with a precise reason); ``convert.readings`` turns profiles into raw
readings that the mapping files in ``mappings/profiles/`` translate like any live source.
"""
