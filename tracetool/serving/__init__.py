"""The serving path: an OpenAI-compatible server with the collectors on, a probe client,
a delay proxy, and the demo that ties them together.

Importing this package is light; the server pulls in Starlette and uvicorn,
the engine torch, only when they are used.
"""
