"""Cluster state adapters: where the platform and the applications come from.

``manifests`` reads directories of YAML or JSON manifests (the offline state); the informer-backed
live state arrives behind the same interface.
"""
