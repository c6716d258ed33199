"""What tests/unit/test_preview_bounds.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations


def pathological_lines(n: int) -> tuple[str, str]:
    """Two texts of n short lines where every line recurs just under difflib's autojunk bound
    (n/100 times), in a different order on each side: SequenceMatcher then walks about n/100
    candidates for each line at each level of its recursion. 10,000 such lines (29 KB) took 16 s."""
    k = n // 100 + 1
    return "".join(f"{i % k}\n" for i in range(n)), "".join(f"{(i * 7) % k}\n" for i in range(n))
