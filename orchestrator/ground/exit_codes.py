"""The command line's exit codes, in a leaf module: every command imports them, and `oa-sandbox
--help` or `sessions` must not import the turn loop to learn that 2 means a set-up error.

0 finished with no refused call; 3 finished but at least one call was refused; 1 stopped (max turns, a
loop, a budget, the model API, a fatal tool error); 2 a set-up error; 130 cancelled (Ctrl-C)."""

from __future__ import annotations

EXIT_OK, EXIT_STOPPED, EXIT_SETUP, EXIT_REFUSED, EXIT_CANCELLED = 0, 1, 2, 3, 130
EXIT_CODES_HELP = (
    "Exit codes: 0 finished, no call refused; 3 finished, but a call was refused; 1 stopped "
    "(max turns, a loop, a budget, the model API, a fatal error); 2 set-up error; 130 cancelled (Ctrl-C)."
)
