"""Each model family's dialect alone, as data: no socket, no client. What a family declares, what
request it builds from our conversation, what turn it reads from an answer (whole, and streamed event
by event), and that an answer of the wrong shape is a typed error. And the claim of the layout: a
family is one self-contained file, listed once in a registry that is data."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.models.base import Message, RetryableModelError, ToolCall
from orchestrator.models.dialects import DIALECTS, Dialect, dialect
from orchestrator.models.stream import SSEEvent, sse_events
from tests.helpers.fake_model_server import FakeModelServer, sse

SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "n": {"type": "integer", "minimum": 1},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["path"],
    "additionalProperties": False,
}
HISTORY = [
    Message(role="system", content="be brief"),
    Message(role="user", content="fix it"),
    Message(
        role="assistant",
        content="looking",
        tool_calls=[
            ToolCall.model_validate({"id": "c1", "name": "read_file", "arguments": '{"path": "a.py"}'}),
            ToolCall.model_validate({"id": "c2", "name": "read_file", "arguments": '{"path": "b.py"'}),
        ],
    ),
    Message(role="tool", tool_call_id="c1", name="read_file", content="one"),
    Message(role="tool", tool_call_id="c2", name="read_file", content="two"),
]
DIALECTS_DIR = Path(__file__).resolve().parents[2] / "orchestrator" / "models" / "dialects"


def events(raw: list[bytes]) -> list[SSEEvent]:
    return list(sse_events(raw))


def assemble(family: str, raw: list[bytes]) -> tuple[object, list[str]]:
    seen: list[str] = []
    built = dialect(family).assembler(seen.append)
    for event in events(raw):
        built.feed(event)
    return built.turn(), seen


def responses_events(text: str, calls: list[tuple[str, str]]) -> list[bytes]:
    out = [sse({"type": "response.created", "response": {"status": "in_progress"}}, "response.created")]
    out += [
        sse(
            {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": text[i : i + 3]},
            "response.output_text.delta",
        )
        for i in range(0, len(text), 3)
    ]
    for k, (name, raw) in enumerate(calls, 1):
        out.append(
            sse(
                {
                    "type": "response.output_item.added",
                    "output_index": k,
                    "item": {"type": "function_call", "call_id": f"call_{k}", "name": name, "arguments": ""},
                },
                "response.output_item.added",
            )
        )
        out += [
            sse(
                {"type": "response.function_call_arguments.delta", "output_index": k, "delta": raw[i : i + 4]},
                "response.function_call_arguments.delta",
            )
            for i in range(0, len(raw), 4)
        ]
        out.append(
            sse(
                {
                    "type": "response.output_item.done",
                    "output_index": k,
                    "item": {"type": "function_call", "call_id": f"call_{k}", "name": name, "arguments": raw},
                },
                "response.output_item.done",
            )
        )
    out.append(
        sse(
            {
                "type": "response.completed",
                "response": {"status": "completed", "usage": {"input_tokens": 30, "output_tokens": 4}},
            },
            "response.completed",
        )
    )
    return out


# -- declarations ---------------------------------------------------------------------------------
def test_each_family_declares_a_tool_in_its_own_shape():
    assert dialect("openai").declare("t", "does t", SCHEMA) == {
        "type": "function",
        "function": {"name": "t", "description": "does t", "parameters": SCHEMA},
    }
    assert dialect("anthropic").declare("t", "does t", SCHEMA) == {
        "name": "t",
        "description": "does t",
        "input_schema": SCHEMA,
    }
    gemini = dialect("gemini").declare("t", "does t", SCHEMA)
    assert gemini == {
        "name": "t",
        "description": "does t",
        "parameters": {
            "type": "OBJECT",
            "required": ["path"],
            "properties": {
                "path": {"type": "STRING"},
                "n": {"type": "INTEGER", "minimum": 1},
                "tags": {"type": "ARRAY", "items": {"type": "STRING"}},
            },
        },
    }
    assert (
        SCHEMA["type"] == "object" and "additionalProperties" in SCHEMA
    )  # the caller's schema is not changed in place


def test_an_unknown_family_is_refused():
    with pytest.raises(ValueError, match="unknown model family 'cobol'"):
        dialect("cobol")


# -- requests -------------------------------------------------------------------------------------
def test_openai_request_keeps_raw_arguments_and_streams_with_usage():
    body = dialect("openai").request("gpt-x", HISTORY, [{"tool": 1}], stream=True)
    assert list(body) == ["model", "messages", "tools", "stream", "stream_options"]
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    calls = body["messages"][2]["tool_calls"]
    assert (
        calls[0]["function"]["arguments"] == '{"path": "a.py"}'
        and calls[1]["function"]["arguments"] == '{"path": "b.py"'
    )  # broken stays as sent
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "one"}
    assert "stream" not in dialect("openai").request("gpt-x", HISTORY, [], stream=False)
    assert dialect("openai").url("http://h/v1/", "m", True) == "http://h/v1/chat/completions"


def test_anthropic_request_merges_tool_results_and_sends_objects():
    body = dialect("anthropic").request("claude-x", HISTORY, [], stream=False)
    assert body["system"] == "be brief" and body["max_tokens"] > 0 and "tools" not in body and "stream" not in body
    assert body["messages"][1]["content"][1:] == [
        {"type": "tool_use", "id": "c1", "name": "read_file", "input": {"path": "a.py"}},
        {"type": "tool_use", "id": "c2", "name": "read_file", "input": {}},
    ]  # unparsable: {}
    assert body["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "one"},
            {"type": "tool_result", "tool_use_id": "c2", "content": "two"},
        ],
    }
    assert dialect("anthropic").url("https://api.anthropic.com", "m", True) == "https://api.anthropic.com/v1/messages"
    assert dialect("anthropic").url("http://h/v1", "m", True) == "http://h/v1/messages"


def test_gemini_request_puts_model_and_streaming_in_the_url():
    body = dialect("gemini").request("g-1", HISTORY, [{"name": "t"}], stream=True)
    assert body["systemInstruction"] == {"parts": [{"text": "be brief"}]} and body["tools"] == [
        {"functionDeclarations": [{"name": "t"}]}
    ]
    assert body["contents"][1]["parts"][1] == {"functionCall": {"name": "read_file", "args": {"path": "a.py"}}}
    assert [p["functionResponse"]["response"] for p in body["contents"][2]["parts"]] == [
        {"content": "one"},
        {"content": "two"},
    ]
    assert (
        dialect("gemini").url("http://h/v1beta", "g-1", True)
        == "http://h/v1beta/models/g-1:streamGenerateContent?alt=sse"
    )
    assert dialect("gemini").url("http://h/v1beta", "g-1", False) == "http://h/v1beta/models/g-1:generateContent"


@pytest.mark.parametrize("family", list(DIALECTS))
def test_no_key_sends_no_key_header(family):
    with_key, without = dialect(family).headers("sk-secret"), dialect(family).headers("")
    assert "sk-secret" in " ".join(with_key.values()) and "sk-secret" not in json.dumps(without)
    assert set(without) < set(with_key)


# -- whole answers --------------------------------------------------------------------------------
def test_openai_parse_text_calls_usage():
    turn = dialect("openai").parse(
        {
            "choices": [
                {
                    "message": {
                        "content": "hi",
                        "tool_calls": [
                            {"id": "x", "function": {"name": "read_file", "arguments": '{"path": "a"}'}},
                            {"function": {"name": "read_file", "arguments": "{nope"}},
                        ],
                    }
                }
            ],
            "usage": {"prompt_tokens": 3},
        }
    )
    assert turn.text == "hi" and turn.usage == {"prompt_tokens": 3}
    assert (turn.tool_calls[0].id, turn.tool_calls[0].arguments) == ("x", {"path": "a"})
    assert (
        turn.tool_calls[1].id == "call_1"
        and turn.tool_calls[1].raw_arguments == "{nope"
        and turn.tool_calls[1].arguments_error
    )


def test_anthropic_parse_blocks_and_error_body():
    turn = dialect("anthropic").parse(
        {
            "content": [
                {"type": "text", "text": "a"},
                {"type": "tool_use", "id": "t1", "name": "git", "input": {"x": 1}},
                {"type": "text", "text": "b"},
            ],
            "usage": {"input_tokens": 2, "output_tokens": 1},
        }
    )
    assert turn.text == "ab" and turn.tool_calls[0].arguments == {"x": 1} and turn.usage["output_tokens"] == 1
    with pytest.raises(OpenAgentsError, match="answered with an error"):
        dialect("anthropic").parse({"type": "error", "error": {"type": "invalid_request_error"}})


def test_gemini_parse_skips_thoughts_and_names_calls():
    turn = dialect("gemini").parse(
        {
            "candidates": [
                {
                    "content": {
                        "parts": [
                            {"text": "hmm", "thought": True},
                            {"text": "ok"},
                            {"functionCall": {"name": "shell", "args": {"command": "ls"}}},
                        ]
                    }
                }
            ],
            "usageMetadata": {"promptTokenCount": 4},
        }
    )
    assert turn.text == "ok" and turn.tool_calls[0].name == "shell" and turn.tool_calls[0].id.startswith("gemini_")
    assert turn.usage == {"promptTokenCount": 4}


@pytest.mark.parametrize(
    "family, data",
    [
        ("openai", {"choices": []}),
        ("openai", {"choices": [{"message": {"tool_calls": [{"function": {}}]}}]}),
        ("anthropic", {"content": "not blocks"}),
        ("anthropic", {"no": "content"}),
        ("gemini", {"candidates": []}),
        ("gemini", {"candidates": [{"content": {"parts": "no list"}}]}),
    ],
)
def test_a_wrong_shape_is_a_typed_model_error_that_shows_the_answer(family, data):
    with pytest.raises(OpenAgentsError) as info:
        dialect(family).parse(data)
    assert info.value.type == ErrorType.MODEL_API_ERROR and "unexpected shape" in info.value.message
    assert dialect(family).what in info.value.message and str(data)[:20] in info.value.message


# -- streamed answers, event by event -------------------------------------------------------------
def test_openai_stream_assembles_calls_by_index():
    turn, seen = assemble(
        "openai", FakeModelServer.openai_events("hello there", [("read_file", {"path": "a"}), ("git", {"op": "log"})])
    )
    assert "".join(seen) == turn.text == "hello there" and len(seen) > 1
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_s0", "read_file", {"path": "a"}),
        ("call_s1", "git", {"op": "log"}),
    ]
    assert turn.usage["prompt_tokens"] == 11


def test_anthropic_stream_assembles_blocks_and_usage():
    turn, seen = assemble("anthropic", FakeModelServer.anthropic_events("edit", [("edit_file", {"path": "a"})]))
    assert "".join(seen) == turn.text == "edit" and turn.tool_calls[0].arguments == {"path": "a"}
    assert turn.usage == {"input_tokens": 21, "output_tokens": 9}


def test_gemini_stream_takes_each_event_whole():
    raw = [
        sse({"candidates": [{"content": {"parts": [{"text": "he"}]}}]}),
        sse(
            {
                "candidates": [
                    {
                        "content": {"parts": [{"text": "y"}, {"functionCall": {"name": "shell", "args": {}}}]},
                        "finishReason": "STOP",
                    }
                ],
                "usageMetadata": {"totalTokenCount": 9},
            }
        ),
    ]
    turn, seen = assemble("gemini", raw)
    assert (
        seen == ["he", "y"]
        and turn.text == "hey"
        and turn.tool_calls[0].name == "shell"
        and turn.usage == {"totalTokenCount": 9}
    )


@pytest.mark.parametrize(
    "family, raw",
    [
        ("openai", FakeModelServer.openai_events("cut")[:2]),
        ("anthropic", FakeModelServer.anthropic_events("cut")[:4]),
        ("gemini", [sse({"candidates": [{"content": {"parts": [{"text": "cut"}]}}]})]),
        ("openai-responses", responses_events("cut", [])[:-1]),
    ],
)
def test_a_stream_that_ends_early_is_worth_another_try_and_says_so(family, raw):
    built = dialect(family).assembler(None)
    for event in events(raw):
        built.feed(event)
    assert not built.shown  # nobody watched: another attempt repeats nothing
    with pytest.raises(RetryableModelError, match="ended before the answer did"):
        built.turn()


@pytest.mark.parametrize(
    "family, raw, retryable",
    [
        ("openai", [sse({"error": {"message": "overloaded"}})], True),
        ("gemini", [sse({"error": {"code": 503}})], True),
        (
            "anthropic",
            [sse({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}, "error")],
            True,
        ),
        (
            "anthropic",
            [sse({"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}, "error")],
            False,
        ),
        (
            "anthropic",
            [sse({"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": "x"}})],
            False,
        ),
        ("openai", [sse({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 10_000}]}}]})], False),
    ],
)
def test_errors_in_a_stream_map_to_retry_or_typed_error(family, raw, retryable):
    built = dialect(family).assembler(None)
    with pytest.raises(RetryableModelError if retryable else OpenAgentsError):
        for event in events(raw):
            built.feed(event)


# -- OpenAI's Responses API ------------------------------------------------------------------------
def test_responses_request_items_and_flat_non_strict_tools():
    responses = dialect("openai-responses")
    assert responses.declare("t", "does t", SCHEMA) == {
        "type": "function",
        "name": "t",
        "description": "does t",
        "parameters": SCHEMA,
        "strict": False,
    }
    body = responses.request("gpt-5", HISTORY, [{"tool": 1}], stream=True)
    assert list(body) == ["model", "input", "store", "instructions", "tools", "stream"] and body["store"] is False
    assert body["instructions"] == "be brief"
    assert body["input"] == [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "looking"},
        {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": '{"path": "a.py"}'},
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "read_file",
            "arguments": '{"path": "b.py"',
        },  # broken stays as sent
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
    ]
    assert responses.url("https://api.openai.com/v1/", "gpt-5", True) == "https://api.openai.com/v1/responses"
    assert "stream" not in responses.request("gpt-5", HISTORY, [], stream=False)


def test_responses_parse_messages_calls_reasoning_and_failure():
    turn = dialect("openai-responses").parse(
        {
            "status": "completed",
            "usage": {"input_tokens": 7, "output_tokens": 2},
            "output": [
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "secret thoughts"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "on it"}]},
                {"type": "function_call", "call_id": "call_9", "name": "grep_files", "arguments": '{"pattern": "x"}'},
            ],
        }
    )
    assert turn.text == "on it" and turn.usage == {"input_tokens": 7, "output_tokens": 2}
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [("call_9", "grep_files", {"pattern": "x"})]
    with pytest.raises(OpenAgentsError, match="reported an error: invalid_prompt"):
        dialect("openai-responses").parse(
            {"status": "failed", "error": {"code": "invalid_prompt", "message": "no"}, "output": []}
        )
    with pytest.raises(RetryableModelError, match="server_error"):
        dialect("openai-responses").parse({"status": "failed", "error": {"code": "server_error", "message": "oops"}})


def test_responses_stream_assembles_text_calls_and_usage():
    turn, seen = assemble(
        "openai-responses",
        responses_events("let me grep", [("grep_files", '{"pattern": "TODO"}'), ("read_file", '{"path": "a"}')]),
    )
    assert "".join(seen) == turn.text == "let me grep" and len(seen) > 1
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_1", "grep_files", {"pattern": "TODO"}),
        ("call_2", "read_file", {"path": "a"}),
    ]
    assert turn.usage == {"input_tokens": 30, "output_tokens": 4}


@pytest.mark.parametrize(
    "raw, retryable",
    [
        ([sse({"type": "error", "code": "rate_limit_exceeded", "message": "slow"}, "error")], True),
        (
            [
                sse(
                    {"type": "response.failed", "response": {"error": {"code": "server_error", "message": "x"}}},
                    "response.failed",
                )
            ],
            True,
        ),
        (
            [
                sse(
                    {"type": "response.failed", "response": {"error": {"code": "invalid_image", "message": "x"}}},
                    "response.failed",
                )
            ],
            False,
        ),
        ([sse({"type": "response.function_call_arguments.delta", "output_index": -1, "delta": "{"})], False),
    ],
)
def test_responses_stream_errors(raw, retryable):
    built = dialect("openai-responses").assembler(None)
    with pytest.raises(RetryableModelError if retryable else OpenAgentsError):
        for event in events(raw):
            built.feed(event)


# -- a family is one file -------------------------------------------------------------------------
def family_files() -> list[Path]:
    return sorted(p for p in DIALECTS_DIR.glob("*.py") if p.name not in ("__init__.py", "dialect.py"))


def test_the_registry_lists_each_family_file_once():
    """A family file defines one DIALECT and the registry (data, in dialects/__init__.py) holds each;
    the family's name is its file's name, so a reader finds it from the folder alone."""
    modules = {type(d).__module__.rsplit(".", 1)[1]: name for name, d in DIALECTS.items()}
    assert sorted(modules) == sorted(p.stem for p in family_files())
    assert all(stem == family.replace("-", "_") for stem, family in modules.items())
    assert all(
        isinstance(d, Dialect) and d.family == name and d.what and d.key_variable for name, d in DIALECTS.items()
    )


@pytest.mark.parametrize("path", family_files(), ids=lambda p: p.stem)
def test_a_family_file_imports_no_other_family_and_no_client(path):
    """Self-contained: the shared dialect layer, the conversation types, the stream parser and the
    error taxonomy; never a sibling family, the HTTP client or the factory."""
    allowed = {"dialect", "base", "stream", "errors"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert (node.module or "").rsplit(".", 1)[-1] in allowed, (
                f"{path.name}: from {'.' * node.level}{node.module} import ..."
            )
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            assert not any(n.startswith(("orchestrator", "httpx", "tenacity")) for n in names), (
                f"{path.name} imports {names}"
            )
