"""The llama.cpp engine of the policy server: versions exported to GGUF, decoded by llama.cpp.

`to_gguf.py` writes a version's (merged) weights and its Hugging Face tokenizer as a GGUF file,
`runner.py` holds one loaded file (model, context, sequence slots), `engine.py` decodes the
rows of many requests as parallel sequences of one context, `loader.py` ties them to the
registry (export once per version, cached on disk). Prompts are tokenised by the Hugging Face
tokenizer and fed to llama.cpp as ids, so the ids in responses are the learner's ids.
"""
