"""A maths tutor written as a plain LangGraph `StateGraph` over `langchain_openai.ChatOpenAI`."""
