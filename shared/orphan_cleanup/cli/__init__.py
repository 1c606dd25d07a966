"""The operator's CLI, ``orphan-cleanup`` (also ``python -m orphan_cleanup``)."""

from orphan_cleanup.cli.app import main

__all__ = ["main"]
