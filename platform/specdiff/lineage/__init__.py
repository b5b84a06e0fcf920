"""Lineage: plain records written beside artefacts (atomic publication of files and folders)."""
