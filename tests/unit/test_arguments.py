"""Arguments from the model are untrusted: every bad shape is a typed, recoverable error."""

from __future__ import annotations

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.tools.args import validate_arguments


@pytest.mark.parametrize(
    "tool,raw,kind",
    [
        ("read_file", '{"path": "a.txt"', ErrorType.INVALID_ARGUMENTS),  # broken JSON
        ("read_file", "[1, 2]", ErrorType.INVALID_ARGUMENTS),  # not an object
        ("read_file", '{"path": 5}', ErrorType.INVALID_ARGUMENTS),  # wrong type
        ("read_file", "{}", ErrorType.INVALID_ARGUMENTS),  # missing field
        ("read_file", '{"path": "a", "sudo": true}', ErrorType.INVALID_ARGUMENTS),  # extra field
        ("read_file", '{"path": "a", "offset": "3"}', ErrorType.INVALID_ARGUMENTS),  # no coercion
        ("read_file", '{"path": "a", "offset": 0}', ErrorType.INVALID_ARGUMENTS),
        ("shell", '{"command": "ls", "timeout": true}', ErrorType.INVALID_ARGUMENTS),
        ("read_file", '{"path": "' + "a" * 5000 + '"}', ErrorType.INVALID_ARGUMENTS),  # oversized
        ("write_file", '{"path": "a", "content": "' + "x" * (9 * 1024 * 1024) + '"}', ErrorType.INVALID_ARGUMENTS),
        ("read_file", "[" * 100_000 + "]" * 100_000, ErrorType.INVALID_ARGUMENTS),  # deeply nested
        ("read_file", b'{"path": "\xff\xfe"}', ErrorType.INVALID_ARGUMENTS),  # invalid UTF-8
        ("nope", "{}", ErrorType.UNKNOWN_TOOL),
        ("read_file", '{"path": "a\\u0000b"}', ErrorType.PATH_INVALID),
        ("write_file", '{"path": ".GIT/config", "content": ""}', ErrorType.PATH_IN_GIT_DIR),
        (
            "edit_file",
            '{"path": "sub/.git/hooks/pre-commit", "old_text": "a", "new_text": "b"}',
            ErrorType.PATH_IN_GIT_DIR,
        ),
    ],
)
def test_bad_arguments_are_typed_and_recoverable(tool, raw, kind):
    with pytest.raises(OpenAgentsError) as info:
        validate_arguments(tool, raw)
    assert info.value.type == kind and info.value.recoverable


def test_a_large_timeout_is_accepted_and_left_for_clamping():
    assert validate_arguments("shell", '{"command": "true", "timeout": 1000}').timeout == 1000
