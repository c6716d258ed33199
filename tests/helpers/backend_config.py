"""What tests/unit/test_backend_config.py shares with tests/box/test_backend_config_box.py, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

TAG = "openagents-sandbox:oa-no-such-tag"
