"""What a person sees in a terminal (the live view, the painter) and the bounded machine-readable lists (machine.py).
Escaping itself is on the ground floor (ground/text.py), used by every
front-end; the run's summary is the loop's (loop/summary.py)."""
