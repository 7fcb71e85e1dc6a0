"""The house's plan: import rules between the rooms of sweeper/, no cycle (sweeper/__init__.py's map)."""
