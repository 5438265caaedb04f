"""Calibration: GASV/LANTERN tables (tables.py) and the rollout profiler that makes them (profile.py)."""

from .tables import SCHEMA_VERSION, GASVTables, check_tables, load_tables, save_tables

__all__ = ["SCHEMA_VERSION", "GASVTables", "check_tables", "load_tables", "save_tables"]
