"""The container agent: runs the six OpenAgents coder tools inside the sandbox.

Standard library only. It is trusted by nobody: the host re-checks everything it can and
enforces every limit that matters from outside the container.
"""

PROTOCOL_VERSION = 1
