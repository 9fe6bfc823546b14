"""The trainer: `python -m train.main +experiment=NAME`. See docs/training.md."""
