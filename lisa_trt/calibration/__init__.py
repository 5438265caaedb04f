"""Calibration: GASV/LANTERN tables (tables.py) and the one rollout profiler that makes them for every
model family (profile.py)."""

from .profile import calibrate
from .tables import SCHEMA_VERSION, GASVTables, check_tables, load_tables, save_tables

__all__ = ["SCHEMA_VERSION", "GASVTables", "calibrate", "check_tables", "load_tables", "save_tables"]
