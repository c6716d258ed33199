"""A tiny calculator with a bug for the agent to fix."""


def add(a: int, b: int) -> int:
    return a - b


def mean(values: list[float]) -> float:
    return sum(values) / len(values)
