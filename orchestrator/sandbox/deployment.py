"""Kept for imports from before the seam moved to base.py (the registry's, older callers')."""
from .base import BoxSpec, Deployment, Sandbox

__all__ = ["BoxSpec", "Deployment", "Sandbox"]
