"""Agents a team would write itself, joined to arloop by their base URL (docs/any_agent.md)."""
