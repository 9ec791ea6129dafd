"""The reservation ledger: pending charges shared by every replica, so no pool overshoots.

Kubernetes' ResourceQuota admission is the model. Each tenant pool has a ``TenantReservation``
(in the pool's namespace, named after it) whose ``status.pending`` lists the admitted increases
not yet observed as objects. Every replica counts those entries into its pools' usage, derived
from its newest copy of each object (see :mod:`webhook.core.admission.pending` for the settle and
release rules), and admits an increase only by adding its entry with a write conditional on the
object's resourceVersion: two requests that each fit alone but not together never both pass.

The parts, from the top: :mod:`.ledger` routes each request; :mod:`.queue` batches one pool's
requests; :mod:`.commit` decides a batch, or a request across pools, and writes it
conditionally; :mod:`.shares` bounds each tenant's share and records carve-out caps;
:mod:`.settle` expires and sweeps; :mod:`.status` builds what each write puts and reconciles the
leader's summary; :mod:`.barrier` waits for the state to pass what the ledger removed;
:mod:`.book` follows and writes the objects; :mod:`.entries`, :mod:`.answers` and
:mod:`.bounds` say what an object lists, what the ledger refuses with, and how far it goes;
:mod:`.slices` counts the escrowed slices an object lists (``docs/escrow.md``), whole.
An API server that ignores ``dryRun`` stores what it calls a dry run (cozystack-api does: its
HelmRelease writes drop the option), so with ``dry_run_holds`` (the default) a dry run is held
like any other admission, as a preview (:mod:`.commit`); without it a dry run never touches the
ledger.
"""

from webhook.admission.ledger.bounds import MAX_ENTRIES, MAX_ENTRY_BYTES, LedgerSettings
from webhook.admission.ledger.entries import TENANT_RESERVATIONS
from webhook.admission.ledger.ledger import Ledger
from webhook.admission.ledger.shares import holder

__all__ = [
    "MAX_ENTRIES",
    "MAX_ENTRY_BYTES",
    "TENANT_RESERVATIONS",
    "Ledger",
    "LedgerSettings",
    "holder",
]
