"""The escrow simulation: replicas holding slices of pools' room under crashes and lost writes.

:mod:`.replica` is one replica (its reads, its slices, its decisions and duties, every rule
from ``webhook.core.admission.escrow``), :mod:`.simulator` the seeded schedule and its judge,
:mod:`.broken` the rules deliberately broken to show the judge finds each of them.
"""

from tests.simulation.escrow.simulator import explore, replay_command, run

__all__ = ["explore", "replay_command", "run"]
