"""Vendor names onto the canonical schema: the schema (``mappings/canonical.yaml``), the mapping
files compiled into lookup tables (``mapping``), the mapper that turns one source's raw readings
into per-GPU frames poll after poll (``mapper``), the profiling guard (a zero that is not a value),
and the store that keeps each source's latest frames and health (``store``)."""
