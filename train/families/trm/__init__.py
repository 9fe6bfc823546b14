"""TRM on the trainer (docs/architecture.md, "Adding a model family")."""
