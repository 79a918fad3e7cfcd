"""`arloop serve vllm-sync`: a running vLLM serves the registry's LoRA versions, and says so."""
