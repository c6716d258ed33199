"""A session: its one options type (options.py, SandboxOptions), its assembly (assemble.py,
open_session: the policy value, model, box, registry, ladder, transcript, checkpoints, hooks) and its
open parts (opened.py, OpenSession).

Every front-end (run, exec, mcp, acp, batch, --attempts, the plug-ins) differs only in who answers
approvals and who watches the events; everything else is put together here, once, and only the
public API (orchestrator/api/: Sandbox) calls open_session (tests/architecture/test_api_layout.py), which the
front-ends drive through its public methods (tests/architecture/test_frontend_api.py).
"""

from .assemble import attach_model, host_code_mode, open_session, warm_box_config
from .opened import OpenSession
from .options import SandboxOptions

__all__ = ["OpenSession", "SandboxOptions", "attach_model", "host_code_mode", "open_session", "warm_box_config"]
