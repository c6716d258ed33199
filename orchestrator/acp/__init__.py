"""Editor mode: an Agent Client Protocol (ACP) agent over stdio (JSON-RPC 2.0, one message per line)."""
