"""Model families, one package each, a floor above the engines and the exporter: llamagen/
(LlamaGen c2i / t2i), chameleon/ (Chameleon / Lumina-mGPT), janus/ (Janus-Pro) and emu3/ (Emu3),
with the modules the whole-vocabulary prompt-id families share beside them (prompt_family.py,
prompt_target.py, prompt_export.py).

Each package registers its `ModelFamily` (models/family.py, the protocol and the registry, which
loads these packages by name: its `_BUILTIN`) and carries its plug-ins, `export.py` (its
ExportFamily), `shapes.py` (memory-plan shapes) and, for caption features, `captions.py` (its text
encoder); the family object imports each once, on first use, and holds it (`ModelFamily.plugin`,
`.shapes`, `.captions`). docs/families.md says what a family writes; nothing below this floor
imports one.
"""
