"""Example data and a user-style reward module for the shipped recipes (code_tasks, subtraction_jsonl)."""
