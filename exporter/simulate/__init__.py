"""The simulated node (``--simulate``): a generator of raw readings from canonical scenarios.

It is not a vendor reader, so it lives outside ``exporter/sources/``: a scenario states targets
in canonical names, and the simulator inverts each device's mapping file to produce the raw
vendor readings that mapping turns back into those targets.  It plugs into the daemon through
the same ``Source`` contract as the real backends (collector name ``simulator``).
"""

from .scenario import Scenario, load_scenario, scenarios_dir
from .simulator import SimulatorSource

__all__ = ["Scenario", "SimulatorSource", "load_scenario", "scenarios_dir"]
