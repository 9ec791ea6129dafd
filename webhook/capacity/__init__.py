"""The capacity adapters around ``webhook.core.capacity``.

``snapshot`` reads a capacity snapshot from a saved file or the cluster; ``plan`` and
``rebalance`` are the bodies of ``webhook plan`` and ``webhook rebalance`` (the controller that
carries plans out); ``guard_report`` sizes the pod-level guard (``webhook guard``); ``room`` and
``quotas`` watch what the room warning and the guard read (the largest free node memory, the
ResourceQuotas). They may use the core, the Kubernetes adapter and the plumbing, and know
nothing of audit review.
"""
