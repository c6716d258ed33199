"""What a person sees in a terminal: the live view, the painter, rendering of results, the end-of-session summary."""
