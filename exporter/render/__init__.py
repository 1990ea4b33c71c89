"""Frames into exposition bytes, once per cycle: the only place a GPU's identity becomes labels.
``render_cycle`` is what the render thread is handed (a snapshot of the store, the indicators'
frames, pod attribution); ``exposition.Renderer`` builds the families and self-metrics;
``series_lines`` keeps each series' line between cycles; ``textformat`` writes text 0.0.4 and
OpenMetrics; ``seriesfilter`` is the cardinality control; ``process_metrics`` the ``process_*``
family every exporter serves."""
