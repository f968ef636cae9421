"""Hardware profiles as data files (TOML). See planner/hardware.py for the schema."""
