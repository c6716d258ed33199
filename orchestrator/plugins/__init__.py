"""Plug-ins that make the sandbox the box of harnesses people already use (docs/api.md, Plug-ins):
`inspect_provider` (Inspect AI's `SandboxEnvironment`, extra `[inspect]`) and `minisweagent`
(mini-swe-agent's environment class, extra `[minisweagent]`). Each is built on the public API only."""
