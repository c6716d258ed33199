"""The approval ladder and the people (or policies) who answer it."""
