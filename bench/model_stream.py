"""Time to the first model text, streamed against not streamed (issue 27's closing note).

A model server of our own on loopback produces an answer of TOKENS pieces at a steady rate (as a
model generates them: PER_TOKEN_MS each). Streamed, the client shows each piece as it comes; not
streamed, the server answers once the whole text exists. Measured per API family through the real
clients (orchestrator/models), from the call to the first text the watcher gets (for the
non-streamed client: the answer's return, when its text can first be shown).

    python bench/model_stream.py [--tokens 200] [--per-token-ms 20] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.models.base import Message, RetryPolicy  # noqa: E402
from orchestrator.models.dialects import DIALECTS  # noqa: E402
from orchestrator.models.http import HttpModelClient  # noqa: E402
from tests.helpers.fake_model_server import FakeModelServer  # noqa: E402

MESSAGES = [Message(role="system", content="s"), Message(role="user", content="explain the code")]


def client(family: str, server: FakeModelServer, stream: bool):
    url = {"openai": server.base_url, "gemini": f"{server.root_url}/v1beta"}.get(family, server.root_url)
    return HttpModelClient(DIALECTS[family], "m", url, "", RetryPolicy(max_attempts=1), stream=stream)


def script(family: str, server: FakeModelServer, text: str, stream: bool, per_token_s: float, tokens: int) -> None:
    if stream:
        getattr(server, f"{family}_stream")(text, delay_s=per_token_s)
        return
    getattr(server, f"{family}_turn")(text)
    server.replies[-1].delay_s = per_token_s * tokens  # the whole answer exists only once every token does


def first_text_s(family: str, server: FakeModelServer, stream: bool) -> float:
    started = time.perf_counter()
    first: list[float] = []

    def seen(_: str) -> None:
        if not first:
            first.append(time.perf_counter())

    turn = client(family, server, stream).complete(MESSAGES, [], on_text=seen)
    assert turn.text
    return (first[0] if first else time.perf_counter()) - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--per-token-ms", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    text = "tok " * args.tokens  # the fake splits text into 3-character pieces: about one per token
    pieces = len(text) // 3
    per_piece = args.per_token_ms / 1000 * args.tokens / pieces
    print(
        f"answer: {args.tokens} tokens at {args.per_token_ms:g} ms each "
        f"({args.tokens * args.per_token_ms / 1000:.1f} s to generate), median of {args.runs} runs"
    )
    print(f"{'family':<10} {'streamed':>12} {'not streamed':>14}")
    with FakeModelServer() as server:
        for family in ("openai", "gemini", "anthropic"):
            results = {}
            for stream in (True, False):
                samples = []
                for _ in range(args.runs):
                    script(family, server, text, stream, per_piece, pieces)
                    samples.append(first_text_s(family, server, stream))
                results[stream] = statistics.median(samples)
            print(f"{family:<10} {results[True] * 1000:>10.1f} ms {results[False] * 1000:>12.1f} ms")


if __name__ == "__main__":
    main()
