"""What tests/box/test_fork_attempts.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

CALC = "def add(a, b):\n    return a - b\n"


TEST = (
    "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n    "
    "def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)


def edit(new: str) -> dict:
    return {"name": "edit_file", "arguments": {"path": "calc.py", "old_text": "    return a - b", "new_text": new}}
