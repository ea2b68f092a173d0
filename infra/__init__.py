"""The plumbing a reader may skip: where a model comes from and how it is set up (models.py), the processes of a
torchrun run (distributed.py, fsdp.py), the run folder, its metrics and checkpoints (runs.py), and faster CPU
versions of two functions of common.py (kernels.py). The algorithm files call into it one line per concern."""
