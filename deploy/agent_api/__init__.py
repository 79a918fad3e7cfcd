"""The agent API process (`arloop serve agents`): FastAPI routes over the agent runtime."""
