"""Profiler artifacts (ncu CSV, nsys SQLite, rocprof CSV, Kineto JSON, unitrace CSV) imported into
the canonical schema.

``detect.import_file(path)`` parses one file into a ``model.Profile`` (or raises
``model.ProfileRejected`` with a precise reason); ``convert.add_profile`` turns profiles into raw
readings that the mapping files in ``mappings/profiles/`` translate like any live source.  The
daemon and the ``import`` command parse each file in a child process with kernel-enforced limits
(``isolate.Importer``, ``worker``).
"""
