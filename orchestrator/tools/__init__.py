"""Tools: arguments (validation), declarations (what each model family sees), registry (what is active)."""
