"""Model family packages; each registers a ModelFamily (models/family.py)"""
