"""Software stacks as data files (planner/stacks.py reads them)."""
