"""The embeddable runtime: engine bundles, prompt files, the Pipeline API."""
