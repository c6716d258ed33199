"""MCP both ways: `server` serves the sandboxed tools to MCP clients (Claude Code, Codex, Gemini CLI);
`client` starts the user's own MCP servers on the host and offers their tools to the model."""
