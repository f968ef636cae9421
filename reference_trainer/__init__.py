"""The reference trainer: a small GPT trained in any planner layout on torch.distributed, profiled,
crash-safe, with a run record per run. README.md beside this file says how to run it.

Nothing is imported here: ``record``, ``config`` and ``launch`` load without torch."""
