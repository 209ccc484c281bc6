"""paraplan's version: the ground floor every layer may read (plan provenance, launch-file headers, ``--version``)."""

__version__ = "0.1.0"
