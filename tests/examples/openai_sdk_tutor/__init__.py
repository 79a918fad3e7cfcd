"""A maths tutor written with the plain OpenAI SDK: a tool loop and a calculator."""
