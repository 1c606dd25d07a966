"""orphan-cleanup: find and remove cloud resources a platform lost track of."""

__version__ = "0.1.0"
