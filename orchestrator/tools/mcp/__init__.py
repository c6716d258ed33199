"""Our MCP client: the user's MCP servers' tools offered to the model beside our own (the MCP *server*, which
offers a session to other agents, is orchestrator/mcp/)."""
