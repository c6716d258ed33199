"""What the host starts for the user, kept out of the box's reach (issue 49): reach.py (whether the
box can change what a path names), resolve.py (a hook's or an MCP server's program and its #!
interpreters, found once at the start outside every box root), system.py (the system's own
programs the product runs: openssl, runsc, debootstrap, tar)."""
