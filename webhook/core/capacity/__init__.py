"""Whether what was admitted can run, and how to make room.

KubeVirt's launcher overhead, the pod-level requests of a charge, the pod-level guard against a
namespace's ResourceQuota, the cluster snapshot model, the planner of live migrations and its
limits, the rebalancer's goals, and the room warning. It may use ``tenancy`` and ``base``; it
knows nothing of pricing or audit review (import-linter keeps them apart).
"""
