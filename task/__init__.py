"""What is learned: the task (tasks.py: problems, verifiers, held-out evaluation, datasets), its preference pairs
(preferences.py) and its reasoning steps (stepwise.py). The algorithm files import these; they import only common.py
and infra/."""
