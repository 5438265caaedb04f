"""Model families, one package each (llamagen/, chameleon/, janus/), a floor above the engines and the exporter.

Each package registers its `ModelFamily` (models/family.py, the protocol and the registry, which
loads these packages by name) and carries its export and memory-shape plugins (`export.py`,
`shapes.py`). docs/families.md says what a family writes; nothing below this floor imports one.
"""
