"""Privilege separation: the one process that holds CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH.

``counter.separate`` (called by the CLI before the daemon starts any thread) starts the counting
process (``child``) where the DRM fdinfo count is on, routes every DRM fdinfo scan through it and
drops every capability of the serving process; ``answer`` is the wire format and the checks of the counter's answer.
docs/privileges.md, "Which process holds what".
"""
