"""Entry point: ``python3 -I -S /opt/openagents/sandbox_agent/__main__.py``.

Isolated mode (-I) ignores PYTHON* variables and the user site; -S skips site-packages, which
keeps start-up and memory small. The package's parent is put on sys.path by hand.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sandbox_agent.server import main  # noqa: E402

main()
