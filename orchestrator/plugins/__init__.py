"""Plug-ins that make the sandbox the box of harnesses people already use (docs/api.md, Plug-ins):
`inspect_provider` (Inspect AI's `SandboxEnvironment`, extra `[inspect]`), `minisweagent`
(mini-swe-agent's environment class, extra `[minisweagent]`) and `swerex_deployment`/`swerex_runtime`
(SWE-ReX's deployment and runtime, extra `[swerex]`). Each is built on the public API only."""
