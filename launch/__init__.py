"""Launchers: `launch.tpu` drives a Cloud TPU slice through gcloud, `launch.local` runs the same
experiments on one machine (CPU/GPU, optionally as several processes standing in for hosts).

Both only build command lines and environments; the training itself is always `python -m
train.main <hydra overrides>`, so a run launched here is the run you would type by hand.
"""
