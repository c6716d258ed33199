"""The contract's bounds (docs/tools.md), in one place for the agent and the host.

A leaf: it imports nothing and does nothing when imported, so the host may import it freely."""

READ_CAP_BYTES = 48 * 1024
READ_DEFAULT_LIMIT_LINES = 2000
LIST_MAX_ENTRIES = 500
LIST_SKIPPED_DIRS = frozenset({".git", "node_modules", "target", "dist"})
GREP_MAX_LINES = 200
GREP_LINE_CHARS = 400
WRITE_MAX_BYTES = 8 * 1024 * 1024
EDIT_MAX_FILE_BYTES = 8 * 1024 * 1024
SHELL_DEFAULT_TIMEOUT_S = 60
SHELL_MAX_TIMEOUT_S = 240
SHELL_OUTPUT_HEAD_BYTES = 32 * 1024
SHELL_OUTPUT_TAIL_BYTES = 16 * 1024
SHELL_MAX_CONCURRENT = 8  # shell commands running at once in one box (RESOURCE_EXHAUSTED beyond)
MAX_REQUEST_BYTES = 16 * 1024 * 1024
GREP_MAX_LINE_BYTES = 8 * 1024 * 1024  # a longer line is searched in its first 8 MiB (the note says so)
BYTES_CHUNK = 2 * 1024 * 1024  # one piece of a file the program's API moves (read_bytes, write_bytes ...)
BYTES_MAX_FILE = 1024 * 1024 * 1024  # the largest file it moves
PROC_MAX = 16  # background processes running at once in one box (Sandbox.start)
PROC_OUTPUT_BYTES = 1024 * 1024  # the output each keeps: its last MiB
GREP_TIMEOUT_S = 30  # the regex search's own deadline, well inside the host's 120 s call deadline

# Environment names that hold a secret (a regular expression, searched case-insensitively): the shell
# tool leaves them out of a command's environment, and the host's transcript redacts their values. A
# string, not a compiled pattern: importing `re` here would cost the agent's start for every tool.
SECRET_NAME_PATTERN = r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|GRANT|AUTH)"
