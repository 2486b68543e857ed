"""Example outside agents for `agent.callable` (docs/agents.md)."""
