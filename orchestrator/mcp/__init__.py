"""The MCP server: `server` serves the sandboxed tools to MCP clients (Claude Code, Codex, Gemini CLI).
Our MCP *client* (the user's own MCP servers started on the host, their tools offered to the model) is
a tool source, beside the other tool and model clients: orchestrator/tools/mcp/."""
