"""The policy server process (`arloop serve policy`): OpenAI-compatible chat completions over the registry's versions."""
