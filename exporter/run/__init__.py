"""Running the exporter: the daemon that wires everything once per (re)load, one runner per enabled
source (its worker thread, timeouts and poll loops), the one poll -> resolve -> map path
(``pipeline``), the periodic loops, reading and validating a (re)load (``loading``), what survives a
reload (``reload_carry``), the settings from the command line, and the baseline state file.
Nothing here knows a vendor or a canonical name."""
